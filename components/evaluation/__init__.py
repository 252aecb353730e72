"""Evaluation: experience-model fidelity (eps_R, eps_P proxies), success rates, judges."""
