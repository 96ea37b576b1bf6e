"""``python -m vllm_doctor`` == the ``vllm-doctor`` command."""

from vllm_doctor.cli import main

if __name__ == "__main__":
    main()
