"""Launch configs -> vLLM invocations -> findings.

Readers (each returns ``Launch`` objects with the argv vLLM would see, the environment, the image,
shared-memory facts and line numbers):
- shell scripts and single ``docker run`` / ``vllm serve`` / ``python -m vllm...`` lines: logical
  lines (backslash-newline joined) lexed with ``shlex``; ``sh -c "..."`` strings are lexed again;
  ``${VAR:-default}`` is expanded from the script's own assignments;
- docker-compose (``services``), Kubernetes Deployment/StatefulSet/DaemonSet/Job/Pod (containers'
  ``command``/``args``/``env``, ``/dev/shm`` volumes), CI YAML (GitLab ``script``, GitHub ``run``),
  a ``.env`` file, a Dockerfile (``FROM``/``ENV``/``CMD``/``ENTRYPOINT``), and vLLM's ``--config``
  YAML (keys are flag names).
Then ``lint_launch`` checks the argv and environment against the target version.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field

from packaging.version import Version

from vllm_doctor import versions
from vllm_doctor.check.findings import CheckFinding
from vllm_doctor.check.knowledge import (INVENTED_ENV, INVENTED_FLAGS, INVENTED_MODULES, V0_ONLY, kv_cache_size_advice, use_prefill_advice,
                        value_problem)

#: vLLM's server images: vllm-openai (docker/Dockerfile), vllm-openai-cpu (docker/Dockerfile.cpu), vllm-openai-rocm
#: (docker/Dockerfile.rocm); each one's `vllm-openai` target has the same ENTRYPOINT (image_entrypoint)
IMAGE_RE = re.compile(r"(?:^|/)vllm-openai(?:-(?:cpu|rocm))?(?::([\w.\-]+))?(?:@sha256:\w+)?$")
#: An image given by its ID (`docker images`' IMAGE ID, or a full sha256): what it runs is not known here
IMAGE_ID_RE = re.compile(r"^(?:sha256:)?[0-9a-f]{12,64}$")
VERSION_TAG_RE = re.compile(r"^v?(\d+\.\d+(?:\.\d+){0,2})")


@dataclass
class Launch:
    argv: list[str]                       # after the entrypoint: what vLLM's parser sees
    entry: str                            # "vllm serve" | "api_server" | "" (image default)
    line: int
    file: str
    env: dict[str, tuple[str, int]] = field(default_factory=dict)
    image: str | None = None
    image_line: int = 0
    gpus: int | None = None               # GPUs given to the container, when known
    shm_ok: bool | None = None            # None: not a container, cannot tell
    shm_hint: str = ""
    runtime: str = ""                     # "compose" | "kubernetes" | "" (docker run, shell): how /dev/shm is given
    wrapped: list[str] = field(default_factory=list)   # words the image's own ENTRYPOINT receives before the
    #                                       flags (`vllm serve`, `serve`, `/bin/sh -c`, `python3 -m ...`): rejected
    joined: str = ""                      # a whole command line given as the one executable of a list-form command


# ---------------------------------------------------------------- helpers

def locate(text: str, token: str, start: int = 1) -> int:
    """1-based line of the first ``token`` at or after line ``start`` (``start`` when absent)."""
    lines = text.splitlines()
    for i in range(max(0, start - 1), len(lines)):
        if token in lines[i]:
            return i + 1
    return start


def _expand(s: str, env: dict[str, str]) -> str:
    def sub(m: re.Match) -> str:
        name, default = m.group(1) or m.group(3), m.group(2)
        return env.get(name, default if default is not None else m.group(0))
    return re.sub(r"\$\{(\w+)(?::?-([^}]*))?\}|\$(\w+)", sub, s)


def image_version(image: str | None) -> tuple[str | None, bool]:
    """(version from a ``vllm/vllm-openai:vX.Y.Z`` tag, whether the tag is unpinned)."""
    if not image:
        return None, False
    m = IMAGE_RE.search(image.split()[0])
    if not m:
        return None, False
    tag = m.group(1)
    if not tag or tag == "latest" or tag == "nightly":
        return None, True
    mv = VERSION_TAG_RE.match(tag)
    return (mv.group(1) if mv else None), False


def _split_vllm(argv: list[str]) -> tuple[str, list[str]] | None:
    """Find the vLLM invocation inside a command: returns (entry, argv after it)."""
    for i, tok in enumerate(argv):
        base = tok.rsplit("/", 1)[-1]
        if base == "vllm" and i + 1 < len(argv) and argv[i + 1] == "serve":
            return "vllm serve", argv[i + 2:]
        if base == "vllm" and i + 1 < len(argv) and argv[i + 1] == "bench":
            return "vllm bench", argv[i + 2:]
        if base.startswith("python") and i + 2 < len(argv) and argv[i + 1] == "-m" and argv[i + 2].startswith("vllm"):
            mod = argv[i + 2]
            return ("api_server" if mod == "vllm.entrypoints.openai.api_server" else "module:" + mod), argv[i + 3:]
    return None


def _shell_c(argv: list[str]) -> str | None:
    for i, tok in enumerate(argv[:-1]):
        if tok.rsplit("/", 1)[-1] in ("sh", "bash") and argv[i + 1] == "-c" and i + 2 < len(argv):
            return argv[i + 2]
        if tok == "-c" and i > 0 and argv[i - 1].rsplit("/", 1)[-1] in ("sh", "bash") and i + 1 < len(argv):
            return argv[i + 1]
    return None


DOCKER_VALUE_OPTS = {"-e", "--env", "-p", "--publish", "-v", "--volume", "--name", "--gpus", "--shm-size", "--ipc",
                     "--env-file", "-w", "--workdir", "--entrypoint", "--network", "--runtime", "-u", "--user",
                     "--mount", "--device", "--cpus", "-m", "--memory", "--restart", "--label", "-l", "--ulimit",
                     "--platform", "--hostname", "-h", "--add-host", "--security-opt", "--cap-add", "--log-opt",
                     "--log-driver", "--health-cmd", "--pull"}


def _docker_run(argv: list[str]) -> dict | None:
    """Parse ``docker run [opts] IMAGE [cmd...]`` into its parts, or None."""
    try:
        i = argv.index("run")
    except ValueError:
        return None
    if i == 0 or argv[i - 1].rsplit("/", 1)[-1] not in ("docker", "podman", "nerdctl"):
        return None
    env: dict[str, str] = {}
    out: dict = {"env": env, "gpus": None, "shm": None, "ipc_host": False, "entrypoint": None}
    j = i + 1
    while j < len(argv):
        tok = argv[j]
        if not tok.startswith("-"):
            break
        name, eq, val = tok.partition("=")
        if not eq and name in DOCKER_VALUE_OPTS:
            j += 1
            val = argv[j] if j < len(argv) else ""
        if name in ("-e", "--env"):
            k, _, v = val.partition("=")
            env[k] = v
        elif name == "--gpus":
            val = val.strip("'\"")
            out["gpus"] = 8 if val == "all" else val.count(",") + 1 if "device=" in val else int(re.sub(r"\D", "", val) or 0) or None
        elif name == "--shm-size":
            out["shm"] = val
        elif name == "--ipc":
            out["ipc_host"] = val == "host"
        elif name == "--entrypoint":
            out["entrypoint"] = val
        j += 1
    if j >= len(argv):
        return None
    out["image"] = argv[j]
    out["cmd"] = argv[j + 1:]
    if out["entrypoint"]:
        # `--entrypoint bash IMAGE -c "vllm serve ..."`: the command is the entrypoint, then the arguments;
        # docker takes --entrypoint as one executable, never split (`--entrypoint "vllm serve"` is a joined command)
        entry = str(out["entrypoint"])
        words, out["joined"] = _joined_command([entry])
        out["cmd"] = (words or [entry]) + argv[j + 1:]
    return out


def _shm_bytes(s: str) -> int:
    m = re.match(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*$", str(s).lower())
    if not m:
        return 0
    return int(float(m.group(1)) * {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}[m.group(2)])


SHM_MIN = 1 << 30   # below 1 GiB NCCL's shared-memory transport fails with large TP buffers


def _wrapper_words(argv: list[str]) -> list[str]:
    """The leading words of a container's arguments that are a command, not the server's flags:
    ``vllm serve``, ``serve``, ``sh -c``/``bash -c`` (and their script), ``python3 -m MODULE``."""
    if not argv:
        return []
    base = argv[0].rsplit("/", 1)[-1]
    if base == "vllm":
        return argv[:2] if argv[1:2] == ["serve"] else argv[:1]
    if base == "serve":
        return argv[:1]
    if base in ("sh", "bash") and argv[1:2] == ["-c"]:
        return argv[:3]
    if base.startswith("python") and argv[1:2] == ["-m"]:
        return argv[:3]
    return []


def _from_command(argv: list[str], env: dict[str, str], line: int, file: str, image: str | None = None,
                  image_line: int = 0, gpus: int | None = None, shm_ok: bool | None = None, shm_hint: str = "",
                  entrypoint_default: bool = False) -> list[Launch]:
    """vLLM launches inside one command (recursing into ``sh -c``). ``entrypoint_default``: ``argv``
    is appended to the image's own ENTRYPOINT (no ``--entrypoint`` / compose ``entrypoint`` /
    Kubernetes ``command``); on the vllm-openai image that ENTRYPOINT is the server itself, so a
    command there (``vllm serve ...``, ``/bin/sh -c ...``) reaches vLLM's parser as arguments."""
    wrapped = _wrapper_words(argv) if entrypoint_default and image else []
    # an image given by its ID may be vllm-openai: `serve` / `vllm serve` there is flagged, as a possibility
    if wrapped and image and (IMAGE_RE.search(image) or (IMAGE_ID_RE.match(image) and wrapped[-1] == "serve")):
        ls = _from_command(argv, env, line, file, image, image_line, gpus, shm_ok, shm_hint)
        if not ls:
            # `serve MODEL --flags`: the server's flags after a word vLLM's parser rejects
            ls = [Launch(argv[len(wrapped):], "", line, file, {k: (v, line) for k, v in env.items()}, image,
                         image_line, gpus, shm_ok, shm_hint)]
        for la in ls:
            la.wrapped = wrapped
        return ls
    inner = _shell_c(argv)
    if inner is not None:
        toks, _err = lex_partial(_expand(inner, env))
        return _from_command(toks, env, line, file, image, image_line, gpus, shm_ok, shm_hint)
    hit = _split_vllm(argv)
    envs = {k: (v, line) for k, v in env.items()}
    if hit:
        entry, rest = hit
        return [Launch(rest, entry, line, file, envs, image, image_line, gpus, shm_ok, shm_hint)]
    if entrypoint_default and image and IMAGE_RE.search(image):
        # the vllm-openai image's ENTRYPOINT runs the server; args are its flags
        return [Launch(argv, "", line, file, envs, image, image_line, gpus, shm_ok, shm_hint)]
    return []


# ---------------------------------------------------------------- readers

HEREDOC_RE = re.compile(r"(?<![<\w])<<-?\s*(['\"]?)([A-Za-z_]\w*)\1")


#: Most lines a quoted string may span (the shell reads on to its closing quote)
QUOTED_LINES_MAX = 16


def _open_quote(s: str) -> str | None:
    """The quote character left open at the end of ``s`` as the shell reads it (backslash escapes
    outside single quotes, ``#`` comments at a word's start), or None; also None when that quote
    opened inside a word (``don't``, ``it's``: prose around a command, not a quoted argument)."""
    q = None
    prev = " "
    esc = False
    at_word_start = True
    for ch in s:
        if esc:
            esc = False
        elif q == "'":
            if ch == "'":
                q = None
        elif ch == "\\":
            esc = True
        elif q == '"':
            if ch == '"':
                q = None
        elif ch in "'\"":
            q = ch
            at_word_start = prev in " \t=(["
        elif ch == "#" and prev in " \t":
            return None
        prev = ch
    return q if q is not None and at_word_start else None


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """(first line number, text) of each logical line: backslash-newlines joined, a quoted string
    that goes on over the next lines joined with them as the shell reads it (``sh -c "vllm serve
    ...`` folded over lines in a YAML ``script:``; at most QUOTED_LINES_MAX lines, else the line
    stays alone and is reported unparsable), heredoc bodies (``<<EOF`` ... ``EOF``: data fed to a
    command, not commands) left out."""
    out, buf, start = [], "", 0
    heredoc: str | None = None
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        raw = lines[i]
        i += 1
        if heredoc is not None:
            if raw.strip() == heredoc:
                heredoc = None
            continue
        if not buf:
            start = i
        if raw.rstrip().endswith("\\"):
            buf += raw.rstrip()[:-1] + " "
            continue
        buf += raw
        if ("'" in raw or '"' in raw) and _open_quote(buf):
            for j in range(i, min(len(lines), i + QUOTED_LINES_MAX - 1)):
                joined = buf + "\n" + "\n".join(lines[i:j + 1])
                if _open_quote(joined) is None:
                    buf, i = joined, j + 1
                    break
        out.append((start, buf))
        m = HEREDOC_RE.search(buf) if "<<" in buf else None
        if m and not buf.lstrip().startswith("#"):
            heredoc = m.group(2)
        buf = ""
    if buf:
        out.append((start, buf))
    return out


def lex_partial(s: str) -> tuple[list[str], str | None]:
    """``shlex.split`` (comments dropped); on an unbalanced quote, the error and the line lexed with the
    quote closed at its end (what was meant, most often), else with the unmatched quote removed (the last
    quote whose removal lets the rest lex), else split on blanks."""
    try:
        return shlex.split(s, comments=True), None
    except ValueError as e:
        err = str(e)
    for q in ('"', "'"):
        try:
            return shlex.split(s + q, comments=True), err
        except ValueError:
            continue
    quotes = [i for i, ch in enumerate(s) if ch in "'\""][-64:]
    for i in reversed(quotes):
        try:
            return shlex.split(s[:i] + s[i + 1:], comments=True), err
        except ValueError:
            continue
    return [t.strip("'\"") for t in s.split()], err


def locate_key(text: str, key: str, start: int) -> int:
    """The line of ``key`` at or after ``start``, else anywhere in the file (a YAML anchor defined above the
    service that merges it: ``<<: *vllm``), else ``start``."""
    lines = text.splitlines()
    for rng in (range(max(0, start - 1), len(lines)), range(0, max(0, start - 1))):
        for i in rng:
            if key in lines[i]:
                return i + 1
    return start


def _env_line(text: str, key: str, start: int) -> int:
    return locate(text, key + "=", start)


#: commands whose VAR=value prefixes fill their own templates (compose files, charts, Makefiles), not vLLM's env
TEMPLATING = {"docker-compose", "podman-compose", "envsubst", "helm", "make", "kustomize", "ansible-playbook"}


def _script_variable(name: str, text: str) -> bool:
    """A variable the script itself reads (``VLLM_VERSION=latest`` ... ``vllm/vllm-openai:$VLLM_VERSION``,
    vllm#17676): without ``export`` it is the script's own, not the environment of what it starts."""
    return re.search(r"\$\{?" + re.escape(name) + r"\b", text) is not None


def read_shell(text: str, file: str, findings: list[CheckFinding]) -> list[Launch]:
    env: dict[str, str] = {}
    exported: dict[str, tuple[str, int]] = {}
    loose: dict[str, tuple[str, int]] = {}          # VLLM_X=1 some-command: set for one command
    attached: set[str] = set()
    launches: list[Launch] = []
    last_entry: str | None = None
    for line, src in _logical_lines(text):
        s = src.strip()
        if not s or s.startswith("#"):
            continue
        m = re.match(r"^(?:export\s+)?([A-Za-z_]\w*)=(.*)$", s)
        if m and " " not in m.group(2).strip().strip("'\"").strip():
            try:
                val = " ".join(shlex.split(_expand(m.group(2), env))) if m.group(2).strip() else ""
            except ValueError:
                val = m.group(2)
            env[m.group(1)] = val
            if s.startswith("export") or (m.group(1).startswith("VLLM_") and not _script_variable(m.group(1), text)):
                exported[m.group(1)] = (val, line)
            continue
        if "vllm" not in (_expand(s, env) if "$" in s else s).lower() and not s.startswith("--"):
            last_entry = None
            continue        # no vLLM launch, image, variable or flag fragment on this line: not lexed (shlex is slow)
        argv, err = lex_partial(s)
        if err:
            findings.append(CheckFinding("VC012", f"cannot lex this line as shell ({err}): the shell reads "
                                         "past the end of the line; the flags on it are still checked, as if the "
                                         "quote were closed there", file, line, snippet=s[:120]))
        # leading VAR=value assignments of one command
        pre: dict[str, str] = {}
        while argv and re.match(r"^[A-Za-z_]\w*=", argv[0]):
            k, _, v = argv.pop(0).partition("=")
            pre[k] = v
        argv = [_expand(a, env) for a in argv]
        if not (argv and (argv[0].rsplit("/", 1)[-1] in TEMPLATING or argv[:2] in (["docker", "compose"], ["podman", "compose"]))):
            loose.update({k: (v, line) for k, v in pre.items() if k.startswith("VLLM_")})
        if argv and argv[0].startswith("--"):          # a fragment of flags (a snippet, a continuation)
            # the continuation of a `vllm bench` / `python -m ...` line (a folded YAML scalar in a document)
            # carries that command's flags, not the server's
            cont = last_entry is not None and (last_entry == "vllm bench" or last_entry.startswith("module:"))
            launches.append(Launch(argv, "continuation" if cont else "fragment", line, file))
            continue
        d = _docker_run(argv)
        if d:
            shm_ok, hint = _docker_shm(d)
            il = locate(text, d["image"], line)
            ls = _from_command(d["cmd"], {**env, **d["env"]}, line, file, d["image"], il, d["gpus"], shm_ok, hint,
                               entrypoint_default=d["entrypoint"] is None)
            denv = {k: (v, _env_line(text, k, line)) for k, v in d["env"].items()}
            for la in ls:
                la.env, la.joined = dict(denv), d.get("joined", "")
            if not ls and IMAGE_RE.search(d["image"]):
                ls = [Launch([], "", line, file, dict(denv), d["image"], il, d["gpus"], shm_ok, hint)]
            launches += ls
            last_entry = ls[-1].entry if ls else None
            continue
        ls = _from_command(argv, env, line, file)
        for la in ls:
            la.env = {**exported, **{k: (v, line) for k, v in pre.items()}}
            attached.update(la.env)
        launches += ls
        last_entry = ls[-1].entry if ls else None
    # VLLM_* variables set in the file that no vLLM launch in it receives are still checked (a script that
    # exports them for a server started elsewhere, a table of variables in a document)
    left = {k: v for k, v in {**exported, **loose}.items() if k.startswith("VLLM_") and k not in attached}
    if left:
        launches.append(Launch([], "env", min(ln for _, ln in left.values()), file, left))
    return launches


def _docker_shm(d: dict) -> tuple[bool, str]:
    if d["ipc_host"]:
        return True, "--ipc=host"
    if d["shm"] is not None:
        return _shm_bytes(d["shm"]) >= SHM_MIN, f"--shm-size {d['shm']}"
    return False, "docker's default /dev/shm is 64 MB"


def _cmd_list(v) -> list[str]:
    if v is None:
        return []
    if isinstance(v, list):
        return [str(x) for x in v]
    try:
        return shlex.split(str(v))
    except ValueError:
        return str(v).split()


def _joined_command(v) -> tuple[list[str] | None, str]:
    """(its words, the item) for a list-form command whose first item holds a whole command line
    (``command: ["python3 -m vllm.entrypoints.openai.api_server --port 8080 ..."]``, vllm#4462): the runtime
    execs that item as the path of one executable, with no shell to split it; else (None, "")."""
    if not (isinstance(v, list) and v and isinstance(v[0], str) and re.search(r"\s", v[0].strip())):
        return None, ""
    try:
        words = shlex.split(v[0])
    except ValueError:
        words = v[0].split()
    return words + [str(x) for x in v[1:]], v[0]


def _env_map(v) -> dict[str, str]:
    if isinstance(v, dict):
        return {str(k): "" if x is None else str(x) for k, x in v.items()}
    out = {}
    for item in v or []:
        if isinstance(item, dict) and "name" in item:
            out[str(item["name"])] = str(item.get("value", ""))
        elif isinstance(item, str):
            k, _, x = item.partition("=")
            out[k] = x
    return out


def read_compose(doc: dict, text: str, file: str) -> list[Launch]:
    out = []
    for name, svc in (doc.get("services") or {}).items():
        if not isinstance(svc, dict):
            continue
        line = locate(text, f"{name}:")
        image = svc.get("image")
        env = _env_map(svc.get("environment"))
        gpus = None
        for dev in (((svc.get("deploy") or {}).get("resources") or {}).get("reservations") or {}).get("devices") or []:
            c = dev.get("count")
            gpus = 8 if c == "all" else int(c) if str(c).isdigit() else gpus
            gpus = len(dev["device_ids"]) if dev.get("device_ids") else gpus
        if svc.get("ipc") == "host":
            shm_ok, hint = True, "ipc: host"
        elif svc.get("shm_size") is not None:
            shm_ok, hint = _shm_bytes(svc["shm_size"]) >= SHM_MIN, f"shm_size {svc['shm_size']}"
        else:
            shm_ok, hint = False, "no shm_size / ipc: host (docker's default /dev/shm is 64 MB)"
        words, joined = _joined_command(svc.get("entrypoint"))
        cmd = (_cmd_list(svc.get("entrypoint")) if words is None else words) + _cmd_list(svc.get("command"))
        cmd_line = locate(text, "command:", line) if svc.get("command") is not None else line
        ls = _from_command(cmd, env, cmd_line, file, image, locate(text, "image:", line), gpus, shm_ok, hint,
                           entrypoint_default=svc.get("entrypoint") is None)
        if not ls and image and IMAGE_RE.search(str(image)):
            ls = [Launch([], "", line, file, {}, image, locate(text, "image:", line), gpus, shm_ok, hint)]
        for la in ls:
            la.runtime, la.joined = "compose", joined
            la.env = {k: (v, locate_key(text, k, line)) for k, v in env.items()}
        out += ls
    return out


K8S_KINDS = {"Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job", "CronJob", "Pod"}


def _pod_spec(doc: dict) -> dict | None:
    kind = doc.get("kind")
    spec = doc.get("spec") or {}
    if kind == "Pod":
        return spec
    if kind == "CronJob":
        spec = ((spec.get("jobTemplate") or {}).get("spec") or {})
    return ((spec.get("template") or {}).get("spec")) if isinstance(spec, dict) else None


def read_k8s(doc: dict, text: str, file: str, start: int) -> list[Launch]:
    ps = _pod_spec(doc)
    if not isinstance(ps, dict):
        return []
    mem_vols = {v.get("name") for v in ps.get("volumes") or []
                if isinstance(v, dict) and (v.get("emptyDir") or {}).get("medium") == "Memory"}
    out = []
    for c in ps.get("containers") or []:
        if not isinstance(c, dict):
            continue
        line = locate(text, str(c.get("name", "containers")), start)
        image = c.get("image")
        env = _env_map(c.get("env"))
        lim = ((c.get("resources") or {}).get("limits") or {})
        g = lim.get("nvidia.com/gpu") or lim.get("amd.com/gpu")
        gpus = int(g) if str(g).isdigit() else None
        shm = any(m.get("mountPath") == "/dev/shm" and m.get("name") in mem_vols for m in c.get("volumeMounts") or [])
        hint = "an emptyDir (medium: Memory) mounted at /dev/shm" if shm else "no /dev/shm emptyDir (medium: Memory): the container runtime's default /dev/shm is 64 MB"
        words, joined = _joined_command(c.get("command"))
        cmd = (_cmd_list(c.get("command")) if words is None else words) + _cmd_list(c.get("args"))
        cl = locate(text, "args:" if c.get("args") else "command:", line)
        ls = _from_command(cmd, env, cl, file, image, locate(text, "image:", line), gpus, shm, hint,
                           entrypoint_default=c.get("command") is None)
        if not ls and image and IMAGE_RE.search(str(image)):
            ls = [Launch([], "", line, file, {}, image, locate(text, "image:", line), gpus, shm, hint)]
        for la in ls:
            la.runtime, la.joined = "kubernetes", joined
            la.env = {k: (v, locate_key(text, k, line)) for k, v in env.items()}
        out += ls
    return out


def read_ci(doc: dict, text: str, file: str, findings: list[CheckFinding]) -> list[Launch]:
    """GitLab CI ``script`` lists and GitHub Actions ``run`` steps: each is shell."""
    out = []
    for job in doc.values() if isinstance(doc, dict) else []:
        if not isinstance(job, dict):
            continue
        scripts = []
        for key in ("before_script", "script", "after_script"):
            v = job.get(key)
            scripts += v if isinstance(v, list) else [v] if isinstance(v, str) else []
        for step in job.get("steps") or []:
            if isinstance(step, dict) and isinstance(step.get("run"), str):
                scripts.append(step["run"])
        for sc in scripts:
            first = str(sc).strip().splitlines()[0] if str(sc).strip() else ""
            line = locate(text, first[:40]) if first else 1
            for la in read_shell(str(sc), file, findings):
                la.line += line - 1
                la.image_line = la.image_line + line - 1 if la.image_line else 0
                out.append(la)
            scan_modules(str(sc), file, line, findings)
    return out


def read_dotenv(text: str, file: str) -> list[Launch]:
    env = {}
    for i, raw in enumerate(text.splitlines(), 1):
        s = raw.strip()
        if not s or s.startswith("#"):
            continue
        k, _, v = s.removeprefix("export ").partition("=")
        env[k.strip()] = (v.strip().strip("'\""), i)
    la = Launch([], "env-file", 1, file, env)
    la.extra_lines = {}  # type: ignore[attr-defined]
    for k, (v, i) in env.items():                 # KEY named after a flag: MAX_NUM_SEQS, CHUNKED_PREFILL_SIZE
        flag = "--" + k.lower().replace("_", "-")
        if not k.startswith("VLLM_") and (versions.known_flag(flag) or flag in INVENTED_FLAGS):
            la.argv += [flag, v.split()[0] if v.split() else v]
            la.extra_lines[flag] = i  # type: ignore[attr-defined]
    return [la]


def read_dockerfile(text: str, file: str) -> list[Launch]:
    image, image_line, env, cmd, line = None, 0, {}, [], 1
    parts: dict[str, list[str]] = {}           # the last CMD and the last ENTRYPOINT: the command is ENTRYPOINT + CMD
    for ln, src in _logical_lines(text):
        s = src.strip()
        m = re.match(r"^(\w+)\s+(.*)$", s)
        if not m or s.startswith("#"):
            continue
        ins, rest = m.group(1).upper(), m.group(2)
        if ins == "FROM":
            image, image_line = rest.split()[0], ln
        elif ins == "ENV":
            toks = shlex.split(rest)
            if len(toks) == 2 and "=" not in toks[0]:
                env[toks[0]] = (toks[1], ln)
            for t in toks:
                if "=" in t:
                    k, _, v = t.partition("=")
                    env[k] = (v, locate(text, k + "=", ln))
        elif ins in ("CMD", "ENTRYPOINT"):
            import json

            try:
                parts[ins] = json.loads(rest) if rest.startswith("[") else shlex.split(rest)
            except ValueError:
                parts[ins] = rest.split()
            line = ln
    words, joined = _joined_command(parts.get("ENTRYPOINT"))
    cmd = (parts.get("ENTRYPOINT", []) if words is None else words) + parts.get("CMD", [])
    ls = (_from_command(cmd, {}, line, file, image, image_line, entrypoint_default="ENTRYPOINT" not in parts)
          if cmd else [])
    if not ls:
        ls = [Launch([], "", image_line or 1, file, {}, image, image_line)]
    for la in ls:
        la.env, la.joined, la.runtime = env, joined, la.runtime or ("dockerfile" if joined else "")
    return ls


def read_vllm_config(doc: dict, text: str, file: str) -> list[Launch]:
    """vLLM's ``--config`` YAML: each key is a flag name (``max_num_seqs`` or ``max-num-seqs``)."""
    argv: list[str] = []
    for k, v in doc.items():
        flag = "--" + str(k).replace("_", "-")
        if isinstance(v, bool):
            if v:
                argv.append(flag)
            continue
        argv += [flag, str(v) if not isinstance(v, (list, dict)) else __import__("json").dumps(v)]
    la = Launch(argv, "config-yaml", 1, file)
    la.extra_lines = {("--" + str(k).replace("_", "-")): locate(text, f"{k}:") for k in doc}  # type: ignore[attr-defined]
    return [la]


def scan_modules(text: str, file: str, base_line: int, findings: list[CheckFinding]) -> None:
    for m in re.finditer(r"python[\d.]*\s+-m\s+(vllm[\w.]*)", text):
        mod = m.group(1)
        if mod in INVENTED_MODULES:
            real, why = INVENTED_MODULES[mod]
            line = base_line + text[: m.start()].count("\n")
            findings.append(CheckFinding("VC011", f"`python -m {mod}`: {why}", file, line,
                                         fix={"setting": real, "value": None}, snippet=m.group(0)))


# ---------------------------------------------------------------- linting

def flags_in(version: str) -> list[str]:
    d = versions._data()
    ex = versions.nearest_examined(version)
    return [f for f, r in d["flags"].items() if f.startswith("--") and versions._in_ranges(r, ex)]


def _ranges_text(flag: str) -> str:
    return versions.flag_ranges_text(flag) or ""


def line_of(la: Launch, text: str, token: str) -> int:
    extra = getattr(la, "extra_lines", None)
    if extra and token in extra:
        return extra[token]
    return locate(text, token, la.line)


def parsed_flags(la: Launch, version: str) -> dict[str, str | None]:
    """argv -> {canonical flag: value or None}, resolving unique abbreviations (for capacity checks)."""
    allf = set(flags_in(version))
    out: dict[str, str | None] = {}
    argv = la.argv
    i = 0
    while i < len(argv):
        tok = argv[i]
        if tok.startswith("--"):
            name, eq, val = tok.partition("=")
            name = name.replace("_", "-")
            if name not in allf:
                cands = [f for f in allf if f.startswith(name)]
                name = cands[0] if len(cands) == 1 else name
            if not eq:
                val = argv[i + 1] if i + 1 < len(argv) and not argv[i + 1].startswith("-") else None
                i += 1 if val is not None else 0
            out[name] = val
        elif tok.startswith("-") and len(tok) > 1:
            alias = SHORT.get(tok)
            if alias and i + 1 < len(argv):
                out[alias] = argv[i + 1]
                i += 1
        i += 1
    return out


SHORT = {"-tp": "--tensor-parallel-size", "-pp": "--pipeline-parallel-size", "-q": "--quantization",
         "-dp": "--data-parallel-size", "-O": "--compilation-config", "-cc": "--compilation-config"}


#: The vllm/vllm-openai image's ENTRYPOINT: the `vllm-openai` target of the release's own docker/Dockerfile
#: (Dockerfile at the top level up to 0.7), read from the sdists of 0.6.3, 0.7.3, 0.8.5, 0.9.2, 0.10.0,
#: 0.10.2, 0.11.0, 0.11.1, 0.11.2, 0.13.0, 0.17.1, 0.20.0, 0.25.0 and 0.33.0: ``["python3", "-m",
#: "vllm.entrypoints.openai.api_server"]`` through 0.11.0, ``["vllm", "serve"]`` from 0.11.1 (docker/Dockerfile.cpu
#: the same; Dockerfile.rocm has a `vllm-openai` target with ``vllm serve`` by 0.17.1). Older sdists do not ship
#: the Dockerfile; 0.2's image ran api_server.py too (vllm#2235: "api_server.py: error: argument
#: --pipeline-parallel-size/-pp"). Real launches agree: "api_server.py: error: unrecognized arguments" on
#: 0.10.0 (vllm#22072) and 0.11.0 (vllm#27389), "vllm: error: unrecognized arguments" on 0.17.1 (vllm#37133).
IMAGE_ENTRYPOINT_VLLM_SERVE_FROM = Version("0.11.1")
#: The first release without the V0 engine (0.10.2 was V0's last)
V0_REMOVED = Version("0.11.0")


def image_entrypoint(pv: Version) -> str:
    """The vllm/vllm-openai image's ENTRYPOINT at that vLLM version, in words."""
    if pv >= IMAGE_ENTRYPOINT_VLLM_SERVE_FROM:
        return "`vllm serve`"
    return "`python3 -m vllm.entrypoints.openai.api_server`"


def lint_wrapped(la: Launch, pv: Version, version: str) -> list[CheckFinding]:
    """A command given as the arguments of the vllm-openai image (VC013): the image's ENTRYPOINT already
    runs the server, so ``vllm serve m``, ``serve m``, ``/bin/sh -c "..."`` or ``python3 -m ...`` after
    the image reach vLLM's argparse as arguments, and it exits with "unrecognized arguments"."""
    w = la.wrapped
    shown = " ".join(w[:2]) if len(w) == 3 and w[1] == "-c" else " ".join(w)
    if la.image and IMAGE_ID_RE.match(la.image):
        msg = (f"`{shown}` after the image {la.image}, given by its ID: what that image runs is not known here. "
               f"If it is a vllm/vllm-openai image, its ENTRYPOINT ({image_entrypoint(pv)} on vLLM {version}) already "
               f"runs the server, these words reach vLLM's argument parser as arguments and it exits at start-up "
               f"(\"error: unrecognized arguments\"); `docker image inspect -f '{{{{json .Config.Entrypoint}}}}' "
               f"{la.image}` shows it. Then delete `{shown}` (and pass --model, or the model first, with its flags)")
        return [CheckFinding("VC013", msg, la.file, la.line, level="warning", snippet=shown,
                             fix={"setting": shown, "value": None, "action": "delete"})]
    where = {"compose": "`command:` of a service with no `entrypoint:`",
             "kubernetes": "`args:` of a container with no `command:`"}.get(la.runtime, "the arguments after the image")
    override = {"compose": "entrypoint:", "kubernetes": "command:"}.get(la.runtime, "--entrypoint")
    script = " (and pass the model and flags of its script directly)" if len(w) == 3 and w[1] == "-c" else ""
    msg = (f"`{shown}` in {where}: the image {la.image} already runs the server (its ENTRYPOINT is "
           f"{image_entrypoint(pv)} on vLLM {version}), so these words reach vLLM's argument parser as arguments "
           f"and it exits at start-up (\"error: unrecognized arguments\"); delete `{shown}`{script}, or set "
           f"{override} to run a command of your own")
    return [CheckFinding("VC013", msg, la.file, la.line, snippet=shown,
                         fix={"setting": shown, "value": None, "action": "delete"})]


def lint_two_words(tok: str, la: Launch, text: str) -> CheckFinding | None:
    """``"--dtype auto"`` as ONE argument (a YAML list item, a quoted word): argparse takes an
    argument that starts with ``-`` and holds a space as a positional, so ``--dtype`` is never set and
    the server exits with "unrecognized arguments: --dtype auto" (VC014)."""
    m = re.match(r"^(--?[\w.\-]+)(\s+)(.*)$", tok, re.S)
    if not m or "=" in m.group(1):
        return None
    flag, val = m.group(1), m.group(3).strip()
    return CheckFinding("VC014", f"`{tok}` is one argument holding two words: vLLM's argparse reads an argument "
                        f"that starts with '-' and contains a space as a positional, not as {flag} {val}, and exits "
                        f"with \"unrecognized arguments: {tok}\"; give {flag} and {val} as two list items "
                        f"(or `{flag}={val}`)", la.file, line_of(la, text, tok.split()[0]), snippet=tok,
                        fix={"setting": flag, "value": val})


def lint_launch(la: Launch, version: str, text: str) -> list[CheckFinding]:
    out: list[CheckFinding] = []
    f = la.file
    pv = versions.parse_version(version) or Version("0.33.0")
    if la.wrapped:
        out += lint_wrapped(la, pv, version)
    if la.joined:
        key = {"compose": "entrypoint:", "kubernetes": "command:", "dockerfile": "ENTRYPOINT"}.get(la.runtime, "--entrypoint")
        words = la.joined.split()
        out.append(CheckFinding("VC014", f"`{la.joined}` is one item of `{key}`: the container runtime runs that item as "
                                f"the path of one executable (no shell splits it), which does not exist, so the container "
                                f"never starts (\"exec: ... executable file not found in $PATH\"); give each word as its "
                                f"own list item", f, locate(text, la.joined[:60], min(la.image_line or la.line, la.line)),
                                snippet=la.joined[:120], fix={"setting": key, "value": json.dumps(words)}))
    allf = flags_in(version)
    allset = set(allf)
    if la.entry.startswith("module:"):
        mod = la.entry[7:]
        if mod in INVENTED_MODULES:
            real, why = INVENTED_MODULES[mod]
            out.append(CheckFinding("VC011", f"`python -m {mod}`: {why}", f, locate(text, mod, la.line),
                                    fix={"setting": real, "value": None}))
        return out
    if la.entry in ("vllm bench", "continuation"):
        return out
    if la.entry == "vllm serve" and pv < Version("0.5.4"):
        out.append(CheckFinding("VC011", f"`vllm serve` does not exist in {version} (console script from 0.5.4)", f,
                                la.line, fix={"setting": "python -m vllm.entrypoints.openai.api_server", "value": None}))
    argv = la.argv
    i = 0
    while i < len(argv):
        tok = argv[i]
        if not tok.startswith("--") or not tok.strip("-"):
            i += 1
            continue
        two = lint_two_words(tok, la, text)
        if two:
            out.append(two)
            i += 1
            continue
        name, eq, val = tok.partition("=")
        has_value = bool(eq) or (i + 1 < len(argv) and not argv[i + 1].startswith("-"))
        if not eq and has_value:
            val = argv[i + 1]
        raw = name
        if pv >= Version("0.5.4"):
            name = name.replace("_", "-")
        line = line_of(la, text, raw)
        if raw == "--config" or name.startswith(("--compilation-config.", "--json-arg")) or "." in name:
            i += 2 if (has_value and not eq) else 1
            continue
        invented = name in INVENTED_FLAGS
        if name not in allset:
            cands = sorted(x for x in allf if x.startswith(name))
            real, why = INVENTED_FLAGS.get(name, (None, None))
            fix = {"setting": real or (cands[0] if cands else None), "value": val if has_value else None}
            sized: dict = {}
            if name == "--kv-cache" and has_value and val.isdigit():     # a token count (the note's 500000)
                why, fix, _ = kv_cache_size_advice(int(val), version, allset, _block_size(argv))
                sized = {"kv_cache_tokens": int(val)}
            if len(cands) > 1:
                msg = (f"{raw}: ambiguous option in vLLM {version} (could match {', '.join(cands[:6])}"
                       f"{', ...' if len(cands) > 6 else ''}): vLLM exits at start-up")
                if sized:
                    msg = sized["read_as"] = msg + ". --kv-cache is not a vLLM flag"
                out.append(CheckFinding("VC002", msg + (f". {why}" if why else ""), f, line,
                                        fix=fix, snippet=tok, extra=sized))
            elif len(cands) == 1:
                msg = f"{raw} is not a flag; vLLM {version}'s argparse reads it as the abbreviation of {cands[0]}"
                if sized:
                    prob = value_problem(cands[0], val, version)
                    msg = sized["read_as"] = msg + (f", so {raw} {val} is {cands[0]} {val}"
                                                    + (f": {prob[0].split(': ', 1)[1]}" if prob else ""))
                lvl = "error" if why else "warning"
                out.append(CheckFinding("VC003", msg + (f". {why}" if why else ""), f, line, level=lvl,
                                        fix=fix, snippet=tok, extra=sized))
                name = cands[0]
            elif versions.known_flag(name):
                out.append(CheckFinding("VC004", f"{raw} exists only in vLLM {_ranges_text(name)}, not in {version}: "
                                        "unrecognized arguments at start-up"
                                        + (f" ({V0_ONLY[name]})" if name in V0_ONLY else ""), f, line,
                                        fix=None, snippet=tok))
            else:
                msg = f"{raw} is not a vLLM flag in any version (argparse: unrecognized arguments)"
                out.append(CheckFinding("VC001", msg + (f". {why}" if why else ""), f, line,
                                        fix={"setting": real, "value": val if has_value else None} if real else None,
                                        snippet=tok))
        if name in V0_ONLY and name in allset and pv >= V0_REMOVED:
            out.append(CheckFinding("VC005", f"{raw} is a V0-engine flag ({V0_ONLY[name]}); vLLM {version} has no "
                                    f"V0 engine (its last release was 0.10.2) to switch to: V1 accepts "
                                    "the flag and ignores it; delete it", f, line, snippet=tok,
                                    fix={"setting": name, "value": None, "action": "delete"}))
        elif name in V0_ONLY and name in allset and pv >= Version("0.8.0"):
            out.append(CheckFinding("VC005", f"{raw} is a V0-engine flag ({V0_ONLY[name]}); on {version} "
                                    "a non-default value makes vLLM fall back to the V0 engine, or fail with VLLM_USE_V1=1",
                                    f, line, snippet=tok))
        if has_value and name in allset and not invented:
            prob = value_problem(name, val, version)
            if prob:
                out.append(CheckFinding("VC006", prob[0], f, line, snippet=tok,
                                        fix={"setting": name, "value": prob[1]} if prob[1] is not None else None))
        i += 2 if (has_value and not eq and _takes_value(name, argv, i)) else 1
    out += lint_env(la, version, text)
    return out


def _takes_value(name: str, argv: list[str], i: int) -> bool:
    """Whether the token after ``name`` is its value (flags named like switches take none)."""
    nxt = argv[i + 1] if i + 1 < len(argv) else ""
    if name.startswith(("--enable-", "--disable-", "--no-")) or name in ("--enforce-eager", "--trust-remote-code"):
        return nxt.lower() in ("true", "false", "1", "0")
    return True


def lint_env(la: Launch, version: str, text: str) -> list[CheckFinding]:
    out = []
    for k, (v, line) in la.env.items():
        if not k.startswith("VLLM_") or k.startswith("VLLM_DOCTOR_"):
            continue
        if k == "VLLM_USE_PREFILL":
            said, real = use_prefill_advice(v, version, _chunked_prefill_switch(la.argv))
            fix = {"setting": k, "value": None, "action": "delete", **({"and": real} if real else {})}
            out.append(CheckFinding("VC007", f"{INVENTED_ENV[k][1]}; {said}", la.file, line, fix=fix,
                                    snippet=f"{k}={v}"))
        elif k in INVENTED_ENV:
            real, why = INVENTED_ENV[k]
            val: object = v.split()[0] if v.split() else None
            out.append(CheckFinding("VC007", why, la.file, line, fix={"setting": real, "value": val}, snippet=f"{k}={v}"))
        elif not versions.flag_exists(k, version):
            where = _ranges_text(k)
            out.append(CheckFinding("VC007", f"{k} is not read by vLLM {version}"
                                    + (f" (it exists in {where})" if where else " (not in any vLLM release's envs.py)"),
                                    la.file, line, snippet=f"{k}={v}"))
    return out


def _block_size(argv: list[str]) -> int | None:
    """The launch's --block-size, when it is a number."""
    for i, a in enumerate(argv):
        name, eq, val = a.partition("=")
        if name.replace("_", "-") == "--block-size":
            val = val if eq else (argv[i + 1] if i + 1 < len(argv) else "")
            return int(val) if val.isdigit() and int(val) > 0 else None
    return None


def _chunked_prefill_switch(argv: list[str]) -> bool | None:
    """The launch's own chunked prefill switch: True (--enable-chunked-prefill[=true]), False (its
    disabling forms, --enable-chunked-prefill=false), None (not given)."""
    got = None
    for i, a in enumerate(argv):
        name, eq, val = a.partition("=")
        name = name.replace("_", "-")
        if name in ("--no-enable-chunked-prefill", "--disable-chunked-prefill"):
            got = False
        elif name == "--enable-chunked-prefill":
            if not eq and i + 1 < len(argv) and argv[i + 1].lower() in ("true", "false", "1", "0"):
                val = argv[i + 1]
            got = val.lower() not in ("false", "0")
    return got


def lint_shm(la: Launch, flags: dict[str, str | None]) -> list[CheckFinding]:
    tp = int(flags.get("--tensor-parallel-size") or 1) if str(flags.get("--tensor-parallel-size") or 1).isdigit() else 1
    pp = int(flags.get("--pipeline-parallel-size") or 1) if str(flags.get("--pipeline-parallel-size") or 1).isdigit() else 1
    world = max(tp * pp, la.gpus if (la.gpus and la.gpus < 8 and not la.argv) else 1)
    if world <= 1 or la.shm_ok is None or la.shm_ok:
        return []
    return [CheckFinding("VC009", f"{world} GPU workers (tensor/pipeline parallel) need shared memory for NCCL and "
                         f"vLLM's worker message queue, but {la.shm_hint}", la.file, la.line,
                         fix={**(d := SHM_FIXES.get(la.runtime, SHM_FIXES[""])), "alternatives": list(d["alternatives"])})]


def _indices(v: str) -> list[int] | None:
    parts = [p.strip() for p in v.strip().strip("'\"").split(",") if p.strip()]
    return [int(p) for p in parts] if parts and all(p.isdigit() for p in parts) else None


#: How a container is given its GPUs, per runtime (la.gpus counts them; 8 stands for `all`, not counted)
GPU_GRANTS = {"": "--gpus", "compose": "the service's device reservation", "kubernetes": "nvidia.com/gpu"}


def lint_visible_devices(la: Launch) -> list[CheckFinding]:
    """VC015: CUDA_VISIBLE_DEVICES set inside a container to the host's GPU indices. The NVIDIA runtime gives
    the container only the GPUs it is granted (``--gpus device=2,3``, ``NVIDIA_VISIBLE_DEVICES=2,3``, compose
    ``device_ids``, a pod's ``nvidia.com/gpu``) and numbers them from 0, so ``CUDA_VISIBLE_DEVICES=2,3`` there
    names GPUs that do not exist; CUDA stops reading the list at the first one (vllm#9865: NVMLError_InvalidArgument)."""
    cvd = la.env.get("CUDA_VISIBLE_DEVICES")
    if not (la.image and cvd):
        return []
    want = _indices(cvd[0])
    if not want:
        return []
    nvd = la.env.get("NVIDIA_VISIBLE_DEVICES")
    given = _indices(nvd[0]) if nvd else None
    n = len(given) if given else la.gpus if la.gpus and la.gpus < 8 else None
    if not n or max(want) < n:
        return []
    how = f"NVIDIA_VISIBLE_DEVICES={nvd[0]}" if given and nvd else GPU_GRANTS.get(la.runtime, "--gpus")
    seen = want[:next(i for i, x in enumerate(want) if x >= n)]
    missing = ",".join(str(x) for x in want if x >= n)
    inside = ",".join(str(i) for i in range(n))
    msg = (f"CUDA_VISIBLE_DEVICES={cvd[0]} inside a container that is given {n} GPU(s) ({how}): the container "
           f"numbers its GPUs {inside}, so GPU {missing} does not exist there; CUDA stops reading the list at the "
           f"first index that does not exist, so vLLM sees {len(seen)} GPU(s) ({','.join(map(str, seen)) or 'none'}) "
           f"and fails at start-up (on vLLM 0.6: pynvml.NVMLError_InvalidArgument). The host's GPUs are chosen by "
           f"{how}; delete CUDA_VISIBLE_DEVICES (or set it to {inside})")
    return [CheckFinding("VC015", msg, la.file, cvd[1], snippet=f"CUDA_VISIBLE_DEVICES={cvd[0]}",
                         fix={"setting": "CUDA_VISIBLE_DEVICES", "value": None, "action": "delete"})]


# how shared memory is given, per runtime: docker run's flags, compose's keys, a pod's memory-backed volume
SHM_FIXES = {
    "": {"setting": "--shm-size", "value": "16g", "alternatives": ["--ipc=host"]},
    "compose": {"setting": "shm_size:", "value": "16g", "alternatives": ["ipc: host"]},
    "kubernetes": {"setting": "volumes: emptyDir {medium: Memory, sizeLimit: 16Gi} mounted at /dev/shm", "value": None,
                   "alternatives": ["hostIPC: true"]},
}
