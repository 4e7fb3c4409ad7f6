"""Offline RL algorithms over encoded transitions: tensor math only, no I/O."""
