"""DreamGym: agent RL in a synthetic environment driven by a reasoning experience model."""
