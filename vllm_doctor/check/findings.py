"""One finding of ``vllm-doctor check`` and the rule catalogue (id, name, level, what it means)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

# id -> (name, default level, short description); levels are SARIF's: error | warning | note
RULES: dict[str, tuple[str, str, str]] = {
    "VC001": ("unknown-flag", "error", "A flag the target vLLM version does not have (argparse: unrecognized arguments)."),
    "VC002": ("ambiguous-flag", "error", "A prefix of several flags of that version (argparse: ambiguous option)."),
    "VC003": ("abbreviated-flag", "warning", "A prefix argparse silently expands to one real flag."),
    "VC004": ("flag-not-in-version", "error", "A real vLLM flag that the target version does not (yet / any more) have."),
    "VC005": ("v0-only-flag", "warning", "A V0-engine flag on a V1 version: falls back to V0 or does nothing."),
    "VC006": ("invalid-value", "error", "A value the version rejects (choices, range)."),
    "VC007": ("unknown-env", "warning", "A VLLM_* environment variable that version never reads."),
    "VC008": ("unpinned-image", "warning", "The image tag is :latest (or absent): the vLLM version is unknown."),
    "VC009": ("no-shared-memory", "error", "Multi-GPU without enough shared memory for NCCL / the worker processes."),
    "VC010": ("kv-capacity", "error", "The KV cache cannot hold what the launch asks for (plan's arithmetic)."),
    "VC011": ("no-such-entrypoint", "error", "A vLLM module or command that does not exist."),
    "VC012": ("unparsable", "warning", "A line or document that could not be read."),
    "VC013": ("command-as-image-arguments", "error", "`vllm serve`, `serve`, `sh -c` or `python3 -m` after the vllm-openai image (no entrypoint override): its ENTRYPOINT already runs the server, which exits with \"unrecognized arguments\"."),
    "VC014": ("two-words-in-one-argument", "error", "One argument (a list item, a quoted word) holding a flag and its value: argparse reads it as a positional and exits with \"unrecognized arguments\"."),
    "VC015": ("gpu-index-outside-container", "error",
              "CUDA_VISIBLE_DEVICES inside a container names a GPU it does not have: a container numbers its GPUs from 0."),
    "VM001": ("series-never-exported", "error", "A series vLLM never exports in the target version: the query never matches."),
    "VM002": ("rate-on-gauge", "error", "rate()/increase() on a gauge."),
    "VM003": ("histogram-quantile-misuse", "error", "histogram_quantile on a non-_bucket series, on buckets without rate()/increase(), or without `le` kept."),
    "VM004": ("rate-threshold-per-window", "warning", "A rate() threshold written as if rate() were per window, not per second."),
    "VM005": ("promql-invalid", "error", "Not valid PromQL (e.g. a function PromQL does not have)."),
    "VM006": ("not-a-vllm-series", "note", "A series vLLM does not export; another exporter must provide it."),
}


@dataclass
class CheckFinding:
    rule_id: str
    message: str
    file: str = "-"
    line: int = 1
    level: str = ""
    fix: dict | None = None          # {"setting": real flag / env var / function, "value": ...}
    snippet: str = ""
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.level:
            self.level = RULES[self.rule_id][1]

    @property
    def name(self) -> str:
        return RULES[self.rule_id][0]

    def to_dict(self) -> dict:
        d = asdict(self)
        d["name"] = self.name
        return d
