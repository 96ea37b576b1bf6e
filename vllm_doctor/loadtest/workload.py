"""What ``bench ladder`` sends: each request's prompt and output length.

- ``fixed``: every prompt ``input_len`` words (about one token each), every output ``output_len``
  tokens (exact: ``ignore_eos``);
- ``sharegpt``: synthetic lengths with the long tail of chat traffic such as the ShareGPT set
  vLLM's ``vllm bench serve`` uses: log-normal (sigma 1.0) prompt and output lengths whose means
  are ``input_len`` and ``output_len``, clipped to [4, 8 x mean]; synthetic text, not ShareGPT's;
- the named profile ``512-1024-2048``: prompts of 512, 1024 and 2048 words in turn (the project's
  original prompt set), outputs of ``output_len``;
- real prompts from a file (``--prompts``): sent in turn, outputs of ``output_len`` (or, with
  ``sharegpt``, drawn as above).

``prefix_ratio`` (0..1): that share of every synthetic prompt is one prefix common to all requests
(a shared system prompt: vLLM's prefix cache serves it after the first request); the rest starts
with the request's number, so that nothing past the shared prefix is cached. 0 (the default):
every prompt starts differently.

Requests are made one at a time from (seed, index): the same seed gives the same workload, and a
ladder of any length holds no list of prompts.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from functools import cached_property

WORDS = ("engine cache block token request queue server model memory page batch prefill decode "
         "scheduler sequence latency throughput kernel tensor layer attention window context "
         "replica cluster metric signal budget").split()

LENGTHS = ("fixed", "sharegpt")
PROFILES = {"512-1024-2048": (512, 1024, 2048)}
SHAREGPT_SIGMA = 1.0


def synthetic_prompt(n_words: int, rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(max(1, n_words)))


def _lognormal(mean: int, rng: random.Random) -> int:
    mu = math.log(max(1, mean)) - SHAREGPT_SIGMA ** 2 / 2
    return int(min(max(4, round(rng.lognormvariate(mu, SHAREGPT_SIGMA))), 8 * max(1, mean)))


@dataclass(frozen=True)
class Workload:
    input_len: int = 128
    output_len: int = 64
    lengths: str = "fixed"            # fixed | sharegpt
    profile: str | None = None        # a name of PROFILES
    prefix_ratio: float = 0.0
    seed: int = 0
    prompts: tuple[str, ...] = ()     # real prompts (a file); empty: synthetic

    def __post_init__(self):
        if self.lengths not in LENGTHS:
            raise ValueError(f"--lengths {self.lengths!r}: one of {', '.join(LENGTHS)}")
        if self.profile is not None and self.profile not in PROFILES:
            raise ValueError(f"--profile {self.profile!r}: one of {', '.join(PROFILES)}")
        if not 0.0 <= self.prefix_ratio < 1.0:
            raise ValueError("--prefix-ratio: a ratio from 0 to below 1")
        if self.prefix_ratio and self.prompts:
            raise ValueError("--prefix-ratio applies to synthetic prompts, not to a file of real prompts (--prompts)")

    @cached_property
    def _shared(self) -> list[str]:
        rng = random.Random(f"prefix-{self.seed}")
        return [rng.choice(WORDS) for _ in range(8 * max(PROFILES.get(self.profile or "", (self.input_len,))))]

    def request(self, i: int) -> tuple[str, int]:
        """The i-th request: (prompt, max_tokens)."""
        rng = random.Random(self.seed * 1_000_003 + i)
        out = _lognormal(self.output_len, rng) if self.lengths == "sharegpt" else self.output_len
        if self.prompts:
            return self.prompts[i % len(self.prompts)], out
        if self.profile:
            sizes = PROFILES[self.profile]
            n = sizes[i % len(sizes)]
        elif self.lengths == "sharegpt":
            n = _lognormal(self.input_len, rng)
        else:
            n = self.input_len
        shared = round(self.prefix_ratio * n)
        head = " ".join(self._shared[:shared]) + " " if shared else ""
        # a distinct word right after the shared prefix keeps vLLM's prefix cache from serving the rest
        return head + f"{i} " + synthetic_prompt(n - shared - 1, rng), out

    def describe(self) -> str:
        if self.prompts:
            what = f"{len(self.prompts)} real prompts from a file"
        elif self.profile:
            what = f"profile {self.profile} (prompts of {', '.join(map(str, PROFILES[self.profile]))} words in turn)"
        elif self.lengths == "sharegpt":
            what = f"ShareGPT-like synthetic lengths (log-normal, mean {self.input_len} prompt words)"
        else:
            what = f"{self.input_len}-word prompts"
        out = (f"ShareGPT-like outputs (log-normal, mean {self.output_len} tokens)" if self.lengths == "sharegpt"
               else f"{self.output_len} output tokens")
        pre = f", {self.prefix_ratio * 100:.0f} % shared prefix" if self.prefix_ratio else ""
        return f"{what}, {out}{pre}"
