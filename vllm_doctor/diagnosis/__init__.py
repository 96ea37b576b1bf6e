"""The rule engine: rules as YAML data (loader), a safe expression language (expr), evaluation
(evaluate). Named ``diagnosis`` so it does not clash with the top-level ``rules/`` data."""

from vllm_doctor.diagnosis.evaluate import RuleEngine
from vllm_doctor.diagnosis.loader import Rule, RuleSet, load_rules

__all__ = ["Rule", "RuleEngine", "RuleSet", "load_rules"]
