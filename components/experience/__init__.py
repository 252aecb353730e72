"""The reasoning experience model: prompt format, strict parser, SFT, synthetic env."""
