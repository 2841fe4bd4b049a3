#!/usr/bin/env python3
"""Kill-and-resume soak of dspine-train (docs/checkpoints.md).

Trains a small CPU configuration, SIGKILLs it at random moments (some while a checkpoint is being
written: at a random training step, or through DSPINE_TEST_KILL_AFTER_FILE, which makes the save
kill its own process right after writing a given file) and restarts it with resume: auto until
the run completes. Then the final weights must equal an uninterrupted run's bitwise, and
metrics.jsonl must hold every step once with the same losses. Also under `mpirun -np 2`, killing
one rank (mpirun then ends the job, which is restarted whole). Exits 1 on any difference.
"""
import argparse
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

# Small enough for a fast CPU step, large enough that saves take a moment.
OVERRIDES = {
    "model.architecture": "simple", "objective.name": "ce", "model.hidden_size": "64",
    "model.intermediate_size": "128", "model.vocab_size": "128", "data.seq_len": "32",
    "training.batch_size": "2", "training.accumulation_steps": "2", "training.device": "cpu",
    "training.cpu_threads": "1", "checkpoint.save_every": "2", "checkpoint.keep_last": "3",
    "logging.every": "1", "logging.progress": "false", "logging.level": "info",
}
STEP_LINE = re.compile(r"step (\d+)/\d+ loss")
SAVE_FILES = ["model.safetensors", "config.json", "rng.safetensors", "trainer_state.json"]


class Job:
    """One dspine-train launch (under mpirun for several ranks), its output in a log file."""

    def __init__(self, args, run_dir, ranks, resume, env_extra):
        command = [str(Path(args.bin) / "dspine-train")]
        if ranks > 1:
            command = [args.mpirun, "-np", str(ranks), "--oversubscribe", "--allow-run-as-root"] + command
        overrides = dict(OVERRIDES, **{
            "training.total_steps": str(args.steps), "checkpoint.resume": resume,
            "checkpoint.dir": str(run_dir / "checkpoints"),
            "logging.metrics_file": str(run_dir / "metrics.jsonl")})
        for key, value in overrides.items():
            command += ["--set", f"{key}={value}"]
        env = dict(os.environ, OMP_NUM_THREADS="1", **env_extra)
        self.log = open(run_dir / "soak.log", "a")
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        env=env, text=True, start_new_session=True)
        self.last_step = -1
        self.ranks = ranks
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.process.stdout:
            self.log.write(line)
            match = STEP_LINE.search(line)
            if match:
                self.last_step = int(match.group(1))

    def rank_pids(self):
        """The processes that run ranks: the job itself, or mpirun's children. (A single
        process's own child is MPI's singleton daemon, not a rank.)"""
        pid = self.process.pid
        if self.ranks == 1:
            return [pid]
        children = Path(f"/proc/{pid}/task/{pid}/children")
        return [int(p) for p in children.read_text().split()] if children.exists() else []

    def wait(self, timeout=300):
        try:
            code = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)  # our own session only
            code = self.process.wait()
        self.reader.join(5)
        self.log.close()
        return code


def run_once(args, run_dir, ranks, resume="auto", env_extra=None):
    job = Job(args, run_dir, ranks, resume, env_extra or {})
    return job.wait()


def saving(run_dir, since):
    """Whether a save that began after `since` is in progress (its .tmp-* directory exists)."""
    for path in (run_dir / "checkpoints").glob(".tmp-*"):
        try:
            if path.stat().st_mtime >= since:
                return True
        except FileNotFoundError:  # renamed meanwhile: that save had finished
            pass
    return False


def newest_step(run_dir):
    steps = [int(p.name[5:]) for p in (run_dir / "checkpoints").glob("step-*")]
    return max(steps, default=0)


def soak(args, run_dir, ranks, kills):
    """Kills and restarts until the run completes; returns the counts."""
    counts = {"kills": 0, "kills_during_saves": 0, "restarts": 0}
    while True:
        env = {}
        killing = counts["kills"] < kills
        by_file = killing and random.random() < 0.35
        if by_file:
            # Rank 1's own file kills one rank of two; rank 0 writes the others.
            names = SAVE_FILES + ([f"optimizer-rank-00001-of-0000{ranks}.safetensors"] if ranks > 1 else
                                  ["optimizer-rank-00000-of-00001.safetensors"])
            env["DSPINE_TEST_KILL_AFTER_FILE"] = random.choice(names)
        started = time.time()
        job = Job(args, run_dir, ranks, "auto", env)
        killed = False
        if killing and not by_file:
            target = newest_step(run_dir) + random.randint(1, 5)
            deadline = time.time() + 120
            while job.process.poll() is None and job.last_step < target and time.time() < deadline:
                time.sleep(0.005)
            time.sleep(random.uniform(0, 0.05))
            pids = job.rank_pids()
            if job.process.poll() is None and pids:
                os.kill(random.choice(pids), signal.SIGKILL)
                killed = True
                counts["kills_during_saves"] += saving(run_dir, started)
        code = job.wait()
        if code == 0:
            return counts
        if not (killed or by_file) or (ranks == 1 and code != -signal.SIGKILL):
            sys.exit(f"soak: dspine-train failed (exit {code}) without being killed; "
                     f"see {run_dir / 'soak.log'}")
        counts["kills"] += 1
        counts["kills_during_saves"] += by_file
        counts["restarts"] += 1
        if counts["restarts"] > kills + 20:
            sys.exit(f"soak: {run_dir} does not complete; see {run_dir / 'soak.log'}")


def metrics(run_dir):
    records = [json.loads(line) for line in open(run_dir / "metrics.jsonl") if line.strip()]
    return [(r["step"], r["loss"]) for r in records]


def compare(args, run_dir, reference):
    """Problems of a soaked run against the uninterrupted reference."""
    problems = []
    final = f"checkpoints/step-{args.steps:06d}/model.safetensors"
    if (run_dir / final).read_bytes() != (reference / final).read_bytes():
        problems.append(f"{final} differs from the uninterrupted run's")
    got, expected = metrics(run_dir), metrics(reference)
    steps = [step for step, _ in got]
    if len(steps) != len(set(steps)):
        problems.append("metrics.jsonl repeats steps")
    if got != expected:
        problems.append(f"metrics.jsonl steps/losses differ: {got} vs {expected}")
    set_aside = [p.name for p in (run_dir / "checkpoints").iterdir() if p.name.startswith(".")]
    if set_aside:
        problems.append(f"left in checkpoint.dir: {set_aside}")
    return problems


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("kills", type=int, nargs="?", default=20, help="kills of the 1-process run")
    parser.add_argument("--mpi-kills", type=int, default=4, help="kills of the 2-rank run (0: skip)")
    parser.add_argument("--steps", type=int, default=None,
                        help="training.total_steps (default: enough for the kills, 3 per kill)")
    parser.add_argument("--bin", default="build/bin", help="directory of dspine-train")
    parser.add_argument("--mpirun", default="mpirun")
    parser.add_argument("--dir", default="runs/soak", help="work directory (emptied first)")
    parser.add_argument("--seed", type=int, default=None, help="seed of the kill moments")
    args = parser.parse_args()
    args.steps = args.steps or max(12, 3 * max(args.kills, args.mpi_kills))
    random.seed(args.seed)
    root = Path(args.dir)
    shutil.rmtree(root, ignore_errors=True)
    failed = False
    for ranks, kills in ((1, args.kills), (2, args.mpi_kills)):
        if kills <= 0:
            continue
        reference, soaked = root / f"np{ranks}_reference", root / f"np{ranks}_soak"
        reference.mkdir(parents=True)
        soaked.mkdir(parents=True)
        if run_once(args, reference, ranks, resume="none") != 0:
            sys.exit(f"soak: the uninterrupted run failed; see {reference / 'soak.log'}")
        counts = soak(args, soaked, ranks, kills)
        problems = compare(args, soaked, reference)
        print(f"np={ranks}: {counts['kills']} kills ({counts['kills_during_saves']} during saves), "
              f"{counts['restarts']} restarts, {args.steps} steps: "
              + ("final weights bitwise equal, loss curve equal, no duplicate steps"
                 if not problems else "FAILED: " + "; ".join(problems)))
        failed |= bool(problems)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
