"""The reward-hack search of :func:`llm_zoo.testing.check_env` (and so of ``llm-zoo check ID``).

An RL policy finds every way to earn reward without doing the task. This package plays an env as
such a policy would, through ``env.step`` only, with *generic* adversarial policies (written once,
for every env, plugins included) and checks the rule of ``DESIGN.md``: **rewards pay most for
solving**.

Its two modules: :mod:`llm_zoo.reward_hacks.policies` writes the policies' answers (what each one
answers, :func:`adversaries`); :mod:`llm_zoo.reward_hacks.search` plays them against the env's
oracle, checks the invariants and reports what broke them (:func:`search_reward_hacks`,
:class:`HackReport`). Their public names are importable from here.
"""

from __future__ import annotations

# The other public names of the single module this package was, still importable from here.
from llm_zoo.reward_hacks.policies import LONG_LIST as LONG_LIST
from llm_zoo.reward_hacks.policies import Adversary, adversaries
from llm_zoo.reward_hacks.search import FIXED as FIXED
from llm_zoo.reward_hacks.search import LATE as LATE
from llm_zoo.reward_hacks.search import TEAM as TEAM
from llm_zoo.reward_hacks.search import Episode, HackReport, find_oracle, search_reward_hacks
from llm_zoo.reward_hacks.search import Mode as Mode
from llm_zoo.reward_hacks.search import Oracle as Oracle

__all__ = ["Adversary", "Episode", "HackReport", "adversaries", "find_oracle", "search_reward_hacks"]
