"""Rollouts: play envs with an engine and turn every (env, turn, agent) group of K into samples."""
