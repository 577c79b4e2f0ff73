"""Reported leak: a sample collector's (episode, agent) -> policy map keeps one entry per
agent-episode.

Thread: https://github.com/ray-project/ray/pull/15783 ("[RLlib] Fix small memory leak in
``SimpleListCollector`` (ever growing ``self.agent_key_to_policy_id`` dict)", merged; superseded
by PR 15815, which closes the multi-agent leak report #9964). RLlib's ``SimpleListCollector``
registers every new agent-episode under ``agent_key = (episode_id, agent_id)`` in
``agent_key_to_policy_id`` and in ``agent_collectors``; when the episode was postprocessed it
deleted the collector but not the mapping, so multi-agent training with many short episodes
grew slowly for as long as it ran. PR 15815's description: "The main memory leak fix is that a
mapping from (agent, episode_id) -> policy_id" (discuss.ray.io thread 2100).

Reproduction: 128 vectorized environments of 8 agents each (32-float observations), episodes of
2 steps on average; the
collector stores each agent's observations per episode, builds a sample batch when the episode
ends and deletes the agent's collector, but not its ``agent_key_to_policy_id`` entry (about 512
new agent-episodes a step, each a key tuple of an episode id and an agent id mapped to a policy
id: small Python objects, outside glibc's main arena, so measured with ``tracemalloc``).
The learner trains on the postprocessed batches. The holder is ``agent_key_to_policy_id``.
Fixed twin: ``ho_fix_policy_id_map`` (the entry deleted with the collector, as in the PR).
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch
from torch import nn

from .. import Scenario
from .._common import CLASSES, IN_DIM, MLP, epochs_loop

SOURCE = "https://github.com/ray-project/ray/pull/15783"
ENVS = 128
AGENTS = 8  # per environment
END_PROB = 0.5  # per environment and step: 2-step episodes on average
POLICIES = ("shared_policy", "opponent_policy")
OBS_SIZE = 32  # floats per agent observation

SCENARIO = Scenario(
    name="ho_rep_policy_id_map",
    is_leak=True,
    leak_start_epoch=0,
    expected_metric="host",
    expected_culprit="agent_key_to_policy_id",
    description="ray#15783: SimpleListCollector's (episode, agent) -> policy map never trimmed",
    # Measured with tracemalloc (benchmarks/measure_planted.py --tracemalloc): small objects.
    planted_bytes_per_step=58_800,
    source=SOURCE,
    split="heldout",
    reported=True,
)


class AgentCollector:
    def __init__(self, obs: np.ndarray) -> None:
        self.obs = [obs]
        self.actions: list[int] = []

    def add(self, action: int, obs: np.ndarray) -> None:
        self.actions.append(action)
        self.obs.append(obs)


class SimpleListCollector:
    """RLlib's collector, reduced to its per-agent-episode bookkeeping."""

    def __init__(self, delete_mapping: bool) -> None:
        self.delete_mapping = delete_mapping
        self.agent_key_to_policy_id: dict[tuple[int, str], str] = {}
        self.agent_collectors: dict[tuple[int, str], AgentCollector] = {}
        self.batches: list[tuple[str, np.ndarray, np.ndarray]] = []

    def add_init_obs(self, episode_id: int, agent_id: str, policy_id: str,
                     obs: np.ndarray) -> None:
        agent_key = (episode_id, agent_id)
        self.agent_key_to_policy_id[agent_key] = policy_id
        self.agent_collectors[agent_key] = AgentCollector(obs)

    def add_action_reward_next_obs(self, episode_id: int, agent_id: str, action: int,
                                   obs: np.ndarray) -> None:
        self.agent_collectors[(episode_id, agent_id)].add(action, obs)

    def postprocess_episode(self, episode_id: int, agent_ids: list[str]) -> None:
        for agent_id in agent_ids:
            agent_key = (episode_id, agent_id)
            collector = self.agent_collectors.pop(agent_key)
            policy_id = self.agent_key_to_policy_id[agent_key]
            if collector.actions:
                self.batches.append((policy_id, np.stack(collector.obs[:-1]),
                                     np.array(collector.actions)))
            if self.delete_mapping:  # the fix
                del self.agent_key_to_policy_id[agent_key]


def _features(obs: np.ndarray) -> torch.Tensor:
    """The policy's input: each observation repeated to IN_DIM features."""
    return torch.from_numpy(np.tile(obs, IN_DIM // OBS_SIZE))


def _run(mw: Any, epochs: int, steps_per_epoch: int, delete_mapping: bool) -> list[list[Any]]:
    torch.manual_seed(0)
    policy = MLP()
    opt = torch.optim.SGD(policy.parameters(), lr=0.01, momentum=0.9)
    rng = np.random.default_rng(0)
    ids = random.Random(0)
    agent_ids = [f"agent_{k}" for k in range(AGENTS)]
    collector = SimpleListCollector(delete_mapping)

    def new_episode() -> int:
        episode_id = ids.randrange(2**62)  # RLlib draws a random id per episode
        obs = rng.standard_normal((AGENTS, OBS_SIZE), dtype=np.float32)
        for k, agent_id in enumerate(agent_ids):
            collector.add_init_obs(episode_id, agent_id, POLICIES[k % 2], obs[k])
        return episode_id

    episodes = [new_episode() for _ in range(ENVS)]

    def step(epoch: int, i: int) -> None:
        obs = rng.standard_normal((ENVS, AGENTS, OBS_SIZE), dtype=np.float32)
        with torch.no_grad():
            actions = policy(_features(obs.reshape(-1, OBS_SIZE))).argmax(1).numpy()
        actions = actions.reshape(ENVS, AGENTS)
        for e, episode_id in enumerate(episodes):
            for k, agent_id in enumerate(agent_ids):
                collector.add_action_reward_next_obs(episode_id, agent_id,
                                                     int(actions[e, k]), obs[e, k])
            if rng.random() < END_PROB:
                collector.postprocess_episode(episode_id, agent_ids)
                episodes[e] = new_episode()
        # The learner consumes the postprocessed batches.
        if not collector.batches:
            return
        x = _features(np.concatenate([b[1] for b in collector.batches])[-256:])
        y = torch.from_numpy(np.concatenate([b[2] for b in collector.batches])[-256:] % CLASSES)
        collector.batches.clear()
        opt.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(policy(x), y).backward()
        opt.step()

    return epochs_loop(mw, epochs, steps_per_epoch, step)


def run(mw: Any, epochs: int, steps_per_epoch: int) -> list[list[Any]]:
    return _run(mw, epochs, steps_per_epoch, delete_mapping=False)
