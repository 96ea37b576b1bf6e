"""``python -m vllm_doctor`` == the ``vllm-doctor`` command."""

from .cli import main

if __name__ == "__main__":
    main()
