"""Running a trio's servers under valgrind's callgrind, and reading what it counts.

For ``--trio-instructions``: a venv whose ``python`` runs the real one under callgrind
(``shim_venv``), zeroing and dumping the servers' counters around a window
(``window``), a dump's instructions in and out of garbage collection (``read_dump``),
and, with ``-X perf``, instructions by Python function (``by_function``).
"""

from __future__ import annotations

import bisect
import collections
import os
import pathlib
import re
import subprocess
import time

from tests.harness.trio import GymTrio

GC_FUNCTION = "gc_collect_main"
EVAL_FUNCTION = "_PyEval_EvalFrameDefault"
FULL_ONLY = "_PyDict_ClearFreeList"
_NAMED = re.compile(r"^\((\d+)\)(?: (.*))?$")
# Where ``-X perf`` makes the interpreter write its map of trampolines: CPython 3.12 and
# 3.13 write it in the system's temporary directory under a fixed name; another
# interpreter's place can be given as a pattern with ``{pid}``.
PERF_MAP = os.environ.get("GYM_AUTOINSTR_PERF_MAP", os.path.join(os.sep, "tmp", "perf-{pid}.map"))


# With --cache-sim, the last level callgrind simulates is a 2 MB, 16-way cache of 64-byte
# lines: the per-core L2 of the hosts these runs come from.  What misses it goes to an L3
# shared with every other process on the machine, which no simulation of one process can
# model, so the L3 itself is left out.
SIMULATED_LL = "2097152,16,64"


def shim_venv(
    real: pathlib.Path, where: pathlib.Path, dumps: pathlib.Path, perf: bool = False, cache_sim: bool = False
) -> pathlib.Path:
    """A venv directory for Gym's ``skip_venv_if_present``: its ``activate`` puts its own
    ``bin`` first, where ``python`` runs ``real``'s interpreter under callgrind with
    counting off (switched on by ``callgrind_control -i on`` once the trio is warm).
    ``perf``: with ``-X perf``, every Python function runs through a trampoline of its
    own, which callgrind counts like a C function and the interpreter's perf map
    (``PERF_MAP``) names.  ``cache_sim``: callgrind also simulates the caches and counts
    first-level and last-level misses."""
    bin_dir = where / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    (bin_dir / "activate").write_text(
        f'export VIRTUAL_ENV="{real}"\nexport PATH="{bin_dir}:{real}/bin:$PATH"\nunset PYTHONHOME\nhash -r\n'
    )
    wrapper = bin_dir / "python"
    wrapper.write_text(
        "#!/bin/sh\n"
        f"exec valgrind -q --tool=callgrind --instr-atstart=no --separate-threads=yes "
        f"{f'--cache-sim=yes --LL={SIMULATED_LL} ' if cache_sim else ''}"
        f'--callgrind-out-file="{dumps}/%p.out" '
        f'"{real}/bin/python"{" -X perf" if perf else ""} "$@"\n'
    )
    wrapper.chmod(0o755)
    return where


def counted_servers(trio: GymTrio) -> dict[str, int]:
    """Server name -> pid of its process running under valgrind."""
    out: dict[str, int] = {}
    for p in trio.processes():
        try:
            name = p.environ().get("NEMO_GYM_CONFIG_PATH")
            if name in trio.ports and "callgrind" in os.path.basename(p.exe()) and name not in out:
                out[name] = p.pid
        except Exception:
            continue
    return out


def control(pids: list[int], *options: str) -> None:
    for pid in pids:
        done = subprocess.run(["callgrind_control", *options, str(pid)], capture_output=True, text=True, timeout=120)
        if done.returncode != 0 or "OK" not in done.stdout:
            raise RuntimeError(f"callgrind_control {' '.join(options)} {pid}: {done.stdout}{done.stderr}")


def newest_dump(dumps: pathlib.Path, pid: int) -> list[pathlib.Path]:
    """The files of a server's newest dump: one per thread (``<pid>.out.<n>-<thread>``)."""
    by_number: dict[int, list[pathlib.Path]] = {}
    for path in dumps.glob(f"{pid}.out.*"):
        by_number.setdefault(int(path.name.rsplit(".", 1)[1].split("-")[0]), []).append(path)
    if not by_number:
        raise RuntimeError(f"no callgrind dump of pid {pid} in {dumps}")
    return sorted(by_number[max(by_number)])


def read_dump(path: pathlib.Path) -> dict:
    """One callgrind dump of one thread: ``ir``, all instructions; ``gc``, those inside
    ``gc_collect_main`` and what it called; ``collections``, the calls of it; ``full``, the
    full collections among them (a full collection, and only a full one, clears the dict
    free list from inside ``gc_collect_main``); ``python``, whether the thread ran Python
    code (the interpreter's ``_PyEval_EvalFrameDefault``).  With more events than Ir
    (``--cache-sim``), ``events`` and ``gc_events`` hold each event's total and its part
    inside ``gc_collect_main``, by the event's name."""
    names: dict[str, str] = {}
    out: dict = {"ir": 0, "gc": 0, "collections": 0, "full": 0, "python": False}
    events, positions = ["Ir"], 1
    totals: list[int] = []
    in_gc: list[int] = []
    current = callee = ""

    def name_of(text: str) -> str:
        m = _NAMED.match(text.strip())
        if not m:
            return text.strip()
        if m.group(2) is not None:
            names[m.group(1)] = m.group(2)
        return names.get(m.group(1), "")

    def add(into: list[int], values: list[str]) -> None:
        for i, value in enumerate(values):
            if i == len(into):
                into.append(0)
            into[i] += int(value)

    with open(path) as fh:
        for line in fh:
            if line.startswith(("summary:", "totals:")):
                values = [int(x) for x in line.split()[1:]]
                if sum(values) >= sum(totals):
                    totals = values
            elif line.startswith("events:"):
                events = line.split()[1:]
            elif line.startswith("positions:"):
                positions = len(line.split()[1:])
            elif line.startswith("fn="):
                current = name_of(line[3:])
                if current == EVAL_FUNCTION:
                    out["python"] = True
            elif line.startswith("cfn="):
                callee = name_of(line[4:])
            elif line.startswith("calls="):  # the next cost line is that call's inclusive cost
                count = int(line[6:].split()[0])
                if callee == GC_FUNCTION and current != GC_FUNCTION:
                    out["collections"] += count
                elif current == GC_FUNCTION and callee == FULL_ONLY:
                    out["full"] += count
            elif current == GC_FUNCTION and line[:1] and (line[0].isdigit() or line[0] in "+-*"):
                add(in_gc, line.split()[positions:])
    named = dict(zip(events, totals + [0] * (len(events) - len(totals))))
    named_gc = dict(zip(events, in_gc + [0] * (len(events) - len(in_gc))))
    out["ir"], out["gc"] = named.get("Ir", 0), named_gc.get("Ir", 0)
    if len(events) > 1:
        out["events"], out["gc_events"] = named, named_gc
    return out


def _summed(counts) -> dict:
    """Event name -> the sum over ``counts`` (dicts of event name -> count)."""
    total: collections.Counter = collections.Counter()
    for c in counts:
        total.update(c)
    return dict(total)


def window(pids: dict[str, int], dumps: pathlib.Path, work) -> dict:
    """Zero every server's counter, run ``work()``, dump; instructions by server."""
    listed = list(pids.values())
    control(listed, "-z")
    started = time.monotonic()
    extra = work()
    seconds = time.monotonic() - started
    control(listed, "-d")
    out = {"seconds": seconds, "servers": {}}
    for name, pid in pids.items():
        threads = [(path, read_dump(path)) for path in newest_dump(dumps, pid)]
        python = [(path, counts) for path, counts in threads if counts["python"]]
        server = {key: sum(counts[key] for _, counts in python) for key in ("ir", "gc", "collections", "full")}
        server["ir_all_threads"] = sum(counts["ir"] for _, counts in threads)
        if python and all("events" in counts for _, counts in python):  # --cache-sim
            for key in ("events", "gc_events"):
                server[key] = _summed(counts[key] for _, counts in python)
        server["threads"] = {path.name.rsplit("-", 1)[-1]: (counts["ir"], counts["python"]) for path, counts in threads}
        server["dumps"] = [str(path) for path, _ in python]
        out["servers"][name] = server
    for key in ("ir", "gc", "collections", "full", "ir_all_threads"):
        out[key] = sum(s[key] for s in out["servers"].values())
    if all("events" in s for s in out["servers"].values()):
        for key in ("events", "gc_events"):
            out[key] = _summed(s[key] for s in out["servers"].values())
    if extra:
        out.update(extra)
    return out


_ANNOTATED = re.compile(r"^\s*([\d,]+)\s+\([^)]*\)\s+(?:\?\?\?:)?0x([0-9a-f]+)\s")


def perf_map(pid: int) -> list[tuple[int, int, str]]:
    """The interpreter's perf map of a server (``-X perf``): (start, size, name) sorted."""
    rows = []
    for line in pathlib.Path(PERF_MAP.format(pid=pid)).read_text().splitlines():
        start, size, name = line.split(" ", 2)
        rows.append((int(start, 16), int(size, 16), name))
    return sorted(rows)


def function_name(name: str) -> str:
    """``py::Qual.name:/.../site-packages/pkg/mod.py`` as ``pkg/mod.py:Qual.name``."""
    qualname, _, path = name.removeprefix("py::").rpartition(":")
    for marker in ("site-packages/", "gym_autoinstr/"):
        if marker in path:
            path = ("gym_autoinstr/" if marker == "gym_autoinstr/" else "") + path.split(marker, 1)[1]
            break
    return f"{path}:{qualname}"


def by_function(pids: dict[str, int], loads: list) -> dict[str, float]:
    """Inclusive instructions per rollout of every Python function of the servers (its
    callees and any garbage collection that struck inside it included), over the load
    windows; the outermost activation of a recursive function only."""
    totals: dict[str, int] = {}
    rollouts = sum(w["n"] for w in loads)
    for name, pid in pids.items():
        rows = perf_map(pid)
        starts = [r[0] for r in rows]
        for window in loads:
            text = "\n".join(
                subprocess.run(
                    ["callgrind_annotate", "--inclusive=yes", "--threshold=100", dump], capture_output=True, text=True
                ).stdout
                for dump in window["servers"][name]["dumps"]
            )
            for line in text.splitlines():
                m = _ANNOTATED.match(line)  # (a recursion level, 0x...'2, does not match: counted in its outermost)
                if not m:
                    continue
                address = int(m.group(2), 16)
                i = bisect.bisect_right(starts, address) - 1
                if i >= 0 and address < rows[i][0] + rows[i][1]:
                    key = function_name(rows[i][2])
                    totals[key] = totals.get(key, 0) + int(m.group(1).replace(",", ""))
    return {k: v / rollouts for k, v in totals.items()}
