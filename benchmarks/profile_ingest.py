"""Where the ingest job's time goes: Java Flight Recorder on the JVM, py-spy on the Python driver.

    make profile-ingest        # 1,000,000 events, 200,000 a batch; then 100 events, 10 a batch
    .venv/bin/python benchmarks/profile_ingest.py --events 100 --max-offsets 10 --name small-batches
    .venv/bin/python benchmarks/profile_ingest.py --mixed --events 600000 --name mixed-batches

Fills a topic like ``benchmarks/throughput.py`` and runs ``sluice run SPEC --available-now``
once, with ``-XX:StartFlightRecording`` on the driver JVM (in local mode it is the executor
too) and the Python driver started under ``py-spy record``. It prints:

- the run summary (Spark's time per phase: ``addBatch`` is Sluice's foreachBatch);
- the JVM's hottest methods by self time and by inclusive time, and the share of samples per
  component (Delta, Parquet, Kafka, JSON, Spark SQL, ...), from ``jdk.ExecutionSample``;
- the Python driver's hottest frames (self and inclusive);
- Spark's jobs, from its event log: how many and how long, per call site and description
  (Delta names its own, such as a snapshot's state rebuild), the first batch's apart.

The recordings stay in ``benchmarks/results/profile/<name>/`` (``ingest.jfr`` opens in JDK
Mission Control; ``driver.txt`` is py-spy's collapsed stacks, for flame-graph tools) beside
a summary, ``profile.json``.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from harness import RESULTS, isolated_home
from throughput import fill, sluice_spec

OUT = RESULTS / "profile"
#: Package prefixes -> the component a sample is charged to (first match from the top of the stack).
COMPONENTS = [
    ("org.apache.spark.sql.delta", "Delta"),
    ("io.delta", "Delta"),
    ("org.apache.parquet", "Parquet"),
    ("org.apache.spark.sql.execution.datasources.parquet", "Parquet"),
    ("org.apache.kafka", "Kafka client"),
    ("org.apache.spark.sql.kafka010", "Kafka source"),
    ("com.fasterxml.jackson", "JSON (Jackson)"),
    ("org.apache.spark.sql.catalyst.json", "JSON (from_json)"),
    ("org.apache.spark.sql.catalyst.expressions", "Spark expressions"),
    ("org.apache.spark.sql.catalyst", "Spark planning"),
    ("org.apache.spark.sql.execution", "Spark execution"),
    ("org.apache.spark.storage", "Spark storage (cache)"),
    ("org.apache.spark.serializer", "Spark serialization"),
    ("org.apache.spark.api.python", "Python bridge"),
    ("py4j", "Python bridge"),
    ("org.apache.hadoop", "Hadoop FS"),
    ("com.github.luben.zstd", "compression"),
    ("org.xerial.snappy", "compression"),
    ("org.apache.spark", "Spark core"),
    ("scala", "Scala library"),
    ("java", "JDK"),
    ("jdk", "JDK"),
    ("sun", "JDK"),
]


def jvm_profile(recording: Path, top: int) -> dict[str, Any]:
    """Self and inclusive sample counts per method, and samples per component."""
    events = _events(recording, "jdk.ExecutionSample", stack_depth=128)
    self_time: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    components: collections.Counter[str] = collections.Counter()
    for event in events:
        frames = [f"{f['method']['type']['name']}.{f['method']['name']}" for f in event["stackTrace"]["frames"]]
        if not frames:
            continue
        self_time[frames[0]] += 1
        inclusive.update(set(frames))
        components[_component(frames)] += 1
    total = len(events)
    return {
        "samples": total,
        "components": {c: round(100 * n / total, 1) for c, n in components.most_common()},
        "self": [(m, round(100 * n / total, 1)) for m, n in self_time.most_common(top)],
        "inclusive": [(m, round(100 * n / total, 1)) for m, n in inclusive.most_common(top * 3)],
    }


def _events(recording: Path, name: str, stack_depth: int = 64) -> list[dict[str, Any]]:
    """The values of every ``name`` event in the recording (``jfr print --json``)."""
    command = ["jfr", "print", "--json", "--stack-depth", str(stack_depth), "--events", name, str(recording)]
    raw = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    return [e["values"] for e in json.loads(raw)["recording"]["events"]]


def _seconds(duration: str) -> float:
    """An ISO-8601 duration as JFR prints it (``PT0.012S``, ``PT1M2.5S``)."""
    found = re.fullmatch(r"PT(?:(\d+)H)?(?:(\d+)M)?(?:([\d.]+)S)?", duration)
    if found is None:
        return 0.0
    h, m, sec = (float(g) if g else 0.0 for g in found.groups())
    return 3600 * h + 60 * m + sec


def jvm_overheads(recording: Path) -> dict[str, Any]:
    """What the samples of running Java code do not show: garbage collection, how busy the
    JVM kept the machine, and the processes it started (Hadoop's shell fallbacks)."""
    gcs = _events(recording, "jdk.GarbageCollection")
    load = _events(recording, "jdk.CPULoad")
    starts = _events(recording, "jdk.ProcessStart")
    commands = collections.Counter(str(e["command"]).split(" ", 1)[0] for e in starts)
    return {
        "gc_count": len(gcs),
        "gc_seconds": round(sum(_seconds(e["duration"]) for e in gcs), 2),
        "gc_longest_s": round(max((_seconds(e["duration"]) for e in gcs), default=0.0), 3),
        "jvm_cpu_share": round(sum(e["jvmUser"] + e["jvmSystem"] for e in load) / max(1, len(load)), 2),
        "machine_cpu_share": round(sum(e["machineTotal"] for e in load) / max(1, len(load)), 2),
        "processes_started": dict(commands.most_common()),
    }


def _component(frames: list[str]) -> str:
    for frame in frames:  # innermost first: the code that burns the time, not who called it
        for prefix, name in COMPONENTS[:-4]:
            if frame.startswith(prefix):
                return name
    for frame in frames:
        for prefix, name in COMPONENTS[-4:]:
            if frame.startswith(prefix):
                return name
    return "other"


def python_profile(collapsed: Path, top: int) -> dict[str, Any]:
    """py-spy's collapsed stacks (``frame;frame;... count``): self and inclusive shares."""
    self_time: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    total = 0
    for line in collapsed.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        n = int(count)
        frames = [re.sub(r" \(.*/", " (", f) for f in stack.split(";")]
        total += n
        self_time[frames[-1]] += n
        for frame in set(frames):
            inclusive[frame] += n
    return {
        "samples": total,
        "self": [(f, round(100 * n / total, 1)) for f, n in self_time.most_common(top)] if total else [],
        "inclusive": [(f, round(100 * n / total, 1)) for f, n in inclusive.most_common(top * 2)] if total else [],
    }


#: Plan nodes that say nothing about what a job does, left out of its label.
WRAPPERS = ("WholeStageCodegen", "InputAdapter", "AdaptiveSparkPlan", "Project", "ColumnarToRow")


def plan_label(plan: dict[str, Any]) -> str:
    """A job's SQL plan in a few words: its operators from the top, wrappers left out, and
    the tables whose Delta state it scans (``Delta Table State #1 - .../events/_delta_log``)."""
    names: list[str] = []
    tables: list[str] = []

    def walk(node: dict[str, Any]) -> None:
        name = node.get("nodeName", "")
        state = re.search(r"Delta Table State.* - .*/([^/]+)/_delta_log", name)
        if state:
            tables.append(state.group(1))
        elif not name.startswith(WRAPPERS) and (not names or names[-1] != name):
            names.append(name[:24] if name.startswith("Scan") else name.split(" ")[0])
        for child in node.get("children", []):
            walk(child)

    walk(plan)
    return " < ".join(names[:6]) + (f" [state of {', '.join(sorted(set(tables)))}]" if tables else "")


def spark_jobs(events: Path, top: int) -> dict[str, Any]:
    """Spark's jobs from its event log, grouped by what they run: the SQL execution's
    description when something other than the stream set it (Delta names its own, such as a
    snapshot's state rebuild; digits made ``N``), else its plan in a few words
    (:func:`plan_label`); with ``[batch]`` on the stream's own thread and ``[beside]`` on
    another (the event log's flushes, Delta's post-commit hooks). Also the jobs' seconds per
    batch, where Spark tells the batch (``streaming.sql.batchId``)."""
    batches: dict[str, float] = collections.defaultdict(float)
    executions: dict[str, str] = {}
    starts: dict[int, tuple[float, str]] = {}
    batch_of: dict[int, str] = {}
    spans: list[tuple[float, float, str]] = []
    for log in sorted(events.iterdir()):
        for line in log.read_text().splitlines():
            event = json.loads(line)
            kind = event.get("Event", "")
            if kind.endswith("SQLExecutionStart"):
                what = event.get("description") or ""
                mine = "runId = " in what  # the stream's batch, or Sluice's work inside it
                label = plan_label(event.get("sparkPlanInfo") or {}) if mine else re.sub(r"\d+", "N", what)
                executions[str(event["executionId"])] = label
            elif kind == "SparkListenerJobStart":
                props = event.get("Properties") or {}
                batch = props.get("streaming.sql.batchId", "?")
                label = executions.get(props.get("spark.sql.execution.id", ""), props.get("callSite.short") or "?")
                label = f"{'[batch]' if batch != '?' else '[beside]'} {label}"
                starts[event["Job ID"]] = (event["Submission Time"] / 1000, label)
                batch_of[event["Job ID"]] = batch
            elif kind == "SparkListenerJobEnd" and event["Job ID"] in starts:
                began, label = starts.pop(event["Job ID"])
                spans.append((began, event["Completion Time"] / 1000, label))
                batches[batch_of.pop(event["Job ID"])] += spans[-1][1] - began
    if not spans:
        return {}
    origin = min(b for b, _, _ in spans)
    total: dict[str, float] = collections.defaultdict(float)
    count: collections.Counter[str] = collections.Counter()
    for began, ended, label in spans:
        total[label] += ended - began
        count[label] += 1
    return {
        "jobs": len(spans),
        "job_seconds": round(sum(e - b for b, e, _ in spans), 2),
        "wall_seconds": round(max(e for _, e, _ in spans) - origin, 2),
        "by_label": [
            (label, count[label], round(sec, 2)) for label, sec in sorted(total.items(), key=lambda t: -t[1])[: top * 2]
        ],
        "by_batch": {batch: round(sec, 2) for batch, sec in sorted(batches.items(), key=lambda b: (len(b[0]), b[0]))},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--max-offsets", type=int, default=200_000)
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument(
        "--mixed",
        action="store_true",
        help="the ablation's records (1 %% to quarantine, 5 %% of the good ones rescued) instead of good ones alone",
    )
    parser.add_argument("--name", default="large-batches", help="the folder under benchmarks/results/profile/")
    args = parser.parse_args()
    py_spy = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or shutil.which("py-spy")
    if py_spy is None:
        raise SystemExit("py-spy is not installed: run `make setup`")

    work = isolated_home("sluice-profile-")
    from rich.console import Console

    from sluice.dev.broker import EmbeddedBroker
    from sluice.ops.submit import ingest_submission
    from sluice.runtime import LOG4J_OPTION, submit_env

    console = Console(width=160)
    out = OUT / args.name
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    recording, collapsed = out / "ingest.jfr", out / "driver.txt"
    # The JVM starts the Python driver with spark.pyspark.driver.python: a wrapper under py-spy.
    wrapper = work / "python-under-py-spy"
    wrapper.write_text(
        f'#!/bin/sh\nexec "{py_spy}" record --format raw --rate 100 --output "{collapsed}" -- "{sys.executable}" "$@"\n'
    )
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    broker = EmbeddedBroker.default()
    broker.start(timeout=120)
    try:
        if args.mixed:  # the ablation's topic has its own partition count
            import ablation

            ablation.fill(broker.bootstrap, "profile", args.events, 0.01, 0.05)
        else:
            fill(broker.bootstrap, "profile", args.partitions, args.events)
        spec = sluice_spec(work, "profiled", "profile", args.max_offsets)
        java = f"{LOG4J_OPTION} -XX:StartFlightRecording=filename={recording},settings=profile,dumponexit=true"
        events = out / "events"
        events.mkdir()
        conf = {
            "spark.driver.extraJavaOptions": java,
            "spark.pyspark.driver.python": str(wrapper),
            "spark.eventLog.enabled": "true",
            "spark.eventLog.dir": events.as_uri(),
            # One plain file of JSON lines: Spark 4 rolls its event log into zstd parts.
            "spark.eventLog.rolling.enabled": "false",
            "spark.eventLog.compress": "false",
        }
        sub = ingest_submission(spec, pipeline_name="profiled", available_now=True, conf=conf)
        started = time.perf_counter()
        done = subprocess.run(sub.command(), env=os.environ | submit_env(sub.master), capture_output=True, text=True)
        seconds = time.perf_counter() - started
        (out / "driver.log").write_text(done.stdout + done.stderr)
        if done.returncode != 0:
            raise SystemExit(f"the job failed ({done.returncode}):\n{(done.stdout + done.stderr)[-3000:]}")
    finally:
        broker.stop()
        shutil.rmtree(work, ignore_errors=True)

    found = re.search(r"run summary (\{.*\})", done.stderr + done.stdout)
    summary = json.loads(found.group(1)) if found else {}
    report: dict[str, Any] = {
        "settings": vars(args),
        "process_s": round(seconds, 2),
        "run_summary": summary,
        "jvm": jvm_profile(recording, args.top),
        "jvm_overheads": jvm_overheads(recording),
        "python": python_profile(collapsed, args.top) if collapsed.exists() else {},
        "spark_jobs": spark_jobs(events, args.top),
    }
    (out / "profile.json").write_text(json.dumps(report, indent=2))
    console.print(f"[bold]run[/]: {seconds:.1f}s whole process; summary {summary}")
    console.print(
        f"[bold]JVM[/] ({report['jvm']['samples']:,} samples), share per component: {report['jvm']['components']}"
    )
    for title, rows in (("JVM self", report["jvm"]["self"]), ("JVM inclusive", report["jvm"]["inclusive"])):
        console.print(f"[bold]{title}[/]")
        for method, share in rows:
            console.print(f"  {share:5.1f} %  {method}")
    for title in ("self", "inclusive"):
        console.print(f"[bold]Python driver {title}[/]")
        for frame, share in report["python"].get(title, []):
            console.print(f"  {share:5.1f} %  {frame}")
    jobs = report["spark_jobs"]
    if jobs:
        console.print(
            f"[bold]Spark jobs[/]: {jobs['jobs']} in {jobs['wall_seconds']} s, {jobs['job_seconds']} s running"
            " (what they run: seconds, jobs)"
        )
        for label, n, sec in jobs["by_label"]:
            console.print(f"  {sec:8.2f} s  {n:4d}  {label}")
        console.print(f"  seconds of jobs per batch: {jobs['by_batch']}")
    console.print(f"saved {out}/ (ingest.jfr, driver.txt, driver.log, events/, profile.json)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
