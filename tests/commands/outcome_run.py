"""A collection run of 300 rollouts (60 tasks x 5 repeats) and 4 rollouts sent to the agent
directly, written for the ``gym-autoinstr view`` outcome tests, and a reward as the view shows it.

The run is written as the embedded default writes one (a directory of per-process
OTLP-JSON files, ``test_view_scale._Process``), in the shapes the advice gives a rollout:

* ``new`` (what the advice writes today): the outcome on the root CLIENT ``POST /run``
  (``invoke_agent``: reward, mask, task and repeat indexes, the rollout's total tokens as
  ``nemo.gym.rollout.usage.*``), on ``gym.rollout`` (the same), on the CLIENT
  ``/verify`` span and ``gym.verify`` (reward); each model call's ``gen_ai.usage.*`` on
  its CLIENT ``chat`` span alone (the model server's ``gym.model.responses`` seam is a
  ``chat`` span without them);
* ``interim`` (an earlier shape): the total as ``gen_ai.usage.*`` on the ``invoke_agent``
  spans, each call's usage on its CLIENT span and on its seam too;
* ``calls``: ``interim`` without the totals (tokens come from the calls, each once);
* ``old``: no operation on the root, tokens on the ``gym.model.*`` seams alone, the
  reward on ``gym.verify`` alone;
* ``fallback``: the root without a reward, ``gym.rollout`` and ``gym.verify`` with
  different ones (the first wins);
* ``outer``: ``gym.rollout``'s total differs from the root's (the root's wins).
"""

from __future__ import annotations

from tests.commands.test_view_scale import _Process

TASKS, REPEATS = 60, 5
DIRECT = 4  # rollouts sent to the agent directly: no collection driver, no task index
STAGES = ("admission", "seed", "agent", "verification", "cleanup")
REWARDS = (0.0, 0.25, 0.5, 0.75, 1.0)


def _shape(index: int) -> str:
    if index % 50 == 3:
        return "outer"
    if index % 11 == 4:
        return "old"
    if index % 13 == 6:
        return "fallback"
    if index % 7 == 2:
        return "calls"
    if index % 9 == 1:
        return "interim"
    return "new"


def _reward(task: int, repeat: int) -> float:
    if task % 10 == 0:
        return 1.0
    if task % 10 == 1:
        return 0.0
    return REWARDS[(task * 3 + repeat * 2) % 5]


def write_outcome_run(directory) -> dict:
    directory.mkdir(parents=True)
    roles = ("orchestrator", "agent", "model", "resources")
    procs = {role: _Process(directory, role, 200 + i, batch=64) for i, role in enumerate(roles)}
    counter = iter(range(1, 1 << 62))

    def sid() -> str:
        return format(next(counter), "016x")

    startup_trace = "5" * 32
    startup = sid()
    procs["orchestrator"].span(startup_trace, startup, None, "gym.startup", 1, -16_000, 0)
    job_trace, job_span = "a" * 32, sid()
    rollouts = []
    for index in range(TASKS * REPEATS + DIRECT):
        direct = index >= TASKS * REPEATS
        task, repeat = (None, None) if direct else divmod(index, REPEATS)
        shape = "new" if direct else _shape(index)
        trace_id = format((index + 1) * 0x9E3779B97F4A7C15F39CC0605CEDC835 % (1 << 128), "032x")
        t0 = index * 20.0
        took = 100 + (index * 37) % 190
        failed = not direct and index % 29 == 13
        stage = STAGES[(index // 29) % len(STAGES)] if failed else None
        masked = not direct and not failed and index % 37 == 5
        reward = 0.0 if masked else (0.5 if direct else _reward(task, repeat))
        if failed and stage != "cleanup":  # a rollout that failed before verify ended has no reward
            reward = None
        calls = 1 + index % 3
        usage = [(100 + 10 * k + index % 7, 20 + k) for k in range(calls)]
        per_call = (sum(u[0] for u in usage), sum(u[1] for u in usage))
        total = per_call if shape in ("new", "outer", "fallback", "interim") else None
        root_total = (per_call[0] + 11, per_call[1] + 3) if shape == "outer" else total
        # where the totals go: our own name today, gen_ai.usage.* on invoke_agent spans before
        total_keys = ("gen_ai.usage." if shape == "interim" else "nemo.gym.rollout.usage.") + "{}_tokens"
        outcome = {} if reward is None else {"nemo.gym.reward": reward, "nemo.gym.mask_sample": masked}
        failure = {"error.type": "RuntimeError", "nemo.gym.failure.stage": stage} if failed else {}

        rid = f"direct-{index}" if direct else f"{task}-{repeat}"
        root_attributes = {"http.request.method": "POST", "nemo.gym.rollout.id": rid}
        if shape != "old":
            root_attributes["gen_ai.operation.name"] = "invoke_agent"
            if shape != "fallback":
                root_attributes.update(outcome)
        if not direct:
            root_attributes.update({"nemo.gym.task.index": task, "nemo.gym.rollout.index": repeat})
        if root_total:
            root_attributes.update(dict(zip((total_keys.format("input"), total_keys.format("output")), root_total)))
        root_attributes.update(failure)
        if direct:
            root = sid()
            procs["agent"].span(trace_id, root, None, "POST /run", 2, t0, t0 + took, root_attributes)
            run = root
        else:
            root = sid()
            procs["orchestrator"].span(
                trace_id,
                root,
                None,
                "POST /run",
                3,
                t0,
                t0 + took,
                {
                    **root_attributes,
                    "nemo.gym.http.destination.server.name": "agent",
                    "nemo.gym.http.destination.route": "/run",
                },
                error=failed,
                links=[(job_trace, job_span)],
            )
            run = sid()
            procs["agent"].span(trace_id, run, root, "POST /run", 2, t0 + 1, t0 + took - 1, {"http.route": "/run"})
        seam_attributes = {} if shape == "old" else {"gen_ai.operation.name": "invoke_agent"}
        if shape not in ("old",):
            seam_attributes.update(outcome)
        if shape == "fallback" and reward is not None:
            seam_attributes["nemo.gym.reward"] = reward
        if not direct and shape != "old":
            seam_attributes.update({"nemo.gym.task.index": task, "nemo.gym.rollout.index": repeat})
        if total:
            seam_attributes.update({total_keys.format("input"): total[0], total_keys.format("output"): total[1]})
        seam = sid()
        procs["agent"].span(trace_id, seam, run, "gym.rollout", 1, t0 + 2, t0 + took - 2, seam_attributes)
        at = t0 + 3
        for tokens_in, tokens_out in usage:
            chat = {"gen_ai.operation.name": "chat"}
            counted = {"gen_ai.usage.input_tokens": tokens_in, "gen_ai.usage.output_tokens": tokens_out}
            client = sid()
            procs["agent"].span(
                trace_id,
                client,
                seam,
                "POST /ng-rollout/{rollout_id}/v1/responses",
                3,
                at,
                at + 12,
                {
                    "nemo.gym.http.destination.server.name": "model",
                    "nemo.gym.http.destination.route": "/v1/responses",
                    **({} if shape == "old" else {**chat, **counted}),
                },
            )
            served = sid()
            procs["model"].span(trace_id, served, client, "POST /v1/responses", 2, at + 1, at + 11, {})
            on_seam = {**chat} if shape in ("new", "outer", "fallback") else {**chat, **counted}
            procs["model"].span(trace_id, sid(), served, "gym.model.responses", 1, at + 2, at + 10, on_seam)
            at += 14
        verify_outcome = dict(outcome)
        if shape == "fallback" and reward is not None:
            verify_outcome["nemo.gym.reward"] = reward + 0.125  # gym.rollout's comes first
        client = sid()
        procs["agent"].span(
            trace_id,
            client,
            seam,
            "POST /ng-rollout/{rollout_id}/verify",
            3,
            at,
            at + 8,
            {
                "nemo.gym.http.destination.server.name": "resources",
                "nemo.gym.http.destination.route": "/verify",
                **({} if shape == "old" else verify_outcome),
            },
            error=failed and stage == "verification",
        )
        served = sid()
        procs["resources"].span(trace_id, served, client, "POST /verify", 2, at + 1, at + 7, {"http.route": "/verify"})
        procs["resources"].span(trace_id, sid(), served, "gym.verify", 1, at + 2, at + 6, verify_outcome)
        rollouts.append(
            {
                "trace_id": trace_id,
                "task": task,
                "repeat": repeat,
                "shape": shape,
                "reward": reward,
                "masked": masked if reward is not None else None,
                "tokens": root_total or per_call,
                "duration_ms": float(took),
                "failed": failed,
                "stage": stage,
            }
        )
    procs["orchestrator"].span(
        job_trace, job_span, None, "gym.job", 1, 0, TASKS * REPEATS * 20.0 + 300, {"nemo.gym.job.id": "j" * 32}
    )
    for process in procs.values():
        process.close()
    return {"dir": directory, "rollouts": rollouts, "job": job_trace, "startup": startup_trace}


def _reward_shown(rollout: dict) -> str:
    if rollout["reward"] is None:
        return ""
    text = f"{rollout['reward']:.3f}".rstrip("0")
    return (text + "0" if text.endswith(".") else text) + ("*" if rollout["masked"] else "")
