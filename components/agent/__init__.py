"""The agent: policy format, baselines (SFT, DPO), multi-turn RL (GRPO, PPO), evaluation."""
