"""``vllm-doctor bench``: prove a tuning step against a live vLLM.

- :mod:`.client`: one streamed request, timed (TTFT, ITL, TPOT, E2E);
- :mod:`.ladder`: the concurrency ladder, vLLM's own preemption counter per level, the knee and the
  ``--max-num-seqs`` advice;
- :mod:`.results`: result files (ours, ``vllm bench serve``, GuideLLM) and the before/after check;
- :mod:`.chart`: the ladder chart (inline SVG / HTML);
- :mod:`.annotate`: findings of ``diagnose``/``serve`` tied to the level where they began;
- :mod:`.cli`: the typer commands.
"""
