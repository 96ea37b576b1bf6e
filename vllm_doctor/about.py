"""vllm-doctor's own version: a leaf module, so that any stage can name it without importing the
package's entry points (``vllm_doctor.diagnose`` imports the whole pipeline)."""

__version__ = "0.1.0"
