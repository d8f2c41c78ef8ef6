"""What a derived pipeline must produce, computed in plain Python from the same events.

Independent of Spark's code: it follows the documented rules (Structured Streaming's
watermark, Sluice's late rule in sluice/spec/derived.py) over the same micro-batches. One
round of events is one upstream commit, read by one data batch followed by the no-data
batch that advances the watermark, which is how an available-now run of the derived
pipeline reads it.

- The watermark before round r is max(event time of every row of rounds < r) - delay (0
  before any), never decreasing; late rows, filtered rows and duplicates all move it.
- A row is late in round r when its latest window's end (its event time, without windows)
  is at or behind that watermark.
- Deduplication keeps the first row of a key; the key is forgotten once its event time plus
  the delay is at or behind the watermark, and a later row of it is kept again.
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

MINUTE = 60_000
BASE = int(datetime(2021, 7, 21, 10, 0, tzinfo=UTC).timestamp() * 1000)


@dataclass(frozen=True)
class Event:
    id: str
    type: str
    actor: str
    repo: str
    size: int
    t: int  # epoch ms

    def json(self) -> dict[str, object]:
        stamp = datetime.fromtimestamp(self.t / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
        return {
            "id": self.id,
            "type": self.type,
            "actor": {"id": abs(hash(self.actor)) % 10_000, "login": self.actor},
            "repo": {"id": abs(hash(self.repo)) % 10_000, "name": self.repo},
            "payload": {"size": self.size} if self.type == "PushEvent" else {},
            "public": True,
            "created_at": stamp,
        }


def schedule(seed: int, rounds: int = 5, per_round: int = 40) -> list[list[Event]]:
    """Rounds of GitHub-like events: mostly in order, some out of order, some behind the
    watermark, retries (the same event again) and ids reused long after."""
    rng = random.Random(seed)
    out: list[list[Event]] = []
    sent: list[Event] = []
    serial = 0
    for r in range(rounds):
        now = BASE + r * 15 * MINUTE
        batch = []
        for _ in range(per_round):
            serial += 1
            delay = rng.choice([0, 0, 0, 1, 2, 4, 8, 14, 25]) * MINUTE + rng.randrange(MINUTE)
            batch.append(
                Event(
                    f"e{serial}",
                    rng.choice(["PushEvent", "PushEvent", "WatchEvent", "IssuesEvent"]),
                    rng.choice(["ana", "bo", "chen", "dee", "eli"]),
                    rng.choice(["acme/api", "acme/web", "octo/cat"]),
                    rng.randrange(1, 6),
                    now - delay + rng.randrange(MINUTE),
                )
            )
        retries = [rng.choice(sent) for _ in range(min(len(sent), 6))]  # producers retry: same event again
        retries += rng.sample(batch, 4)  # and within the same batch
        reused = [
            Event(old.id, old.type, old.actor, old.repo, old.size, now + rng.randrange(MINUTE))
            for old in rng.sample(sent, min(len(sent), 3))
            if old.t < now - 30 * MINUTE  # an id seen long ago (its deduplication state gone), a new event
        ]
        batch += retries + reused
        rng.shuffle(batch)
        sent += batch
        out.append(batch)
    # A last round far ahead, so the watermark closes every window and session before it.
    out.append([Event("sentinel", "WatchEvent", "zed", "zed/zed", 1, BASE + (rounds + 10) * 15 * MINUTE)])
    return out


@dataclass
class Outcome:
    accepted: list[Event] = field(default_factory=list)  # reached the operator
    #: (round, position) of each accepted row: a retry is the same Event, so identity is positional
    accepted_at: set[tuple[int, int]] = field(default_factory=set)
    kept: list[Event] = field(default_factory=list)  # after deduplication
    late: list[tuple[Event, int]] = field(default_factory=list)  # with the watermark that judged it
    filtered: list[Event] = field(default_factory=list)
    watermarks: list[int] = field(default_factory=list)  # before each round
    final_watermark: int = 0
    #: sliding windows in update mode: (window start, key) -> rows counted
    open_window_rows: dict[tuple[int, str], int] = field(default_factory=lambda: defaultdict(int))


def run(
    rounds: list[list[Event]],
    delay_ms: int,
    late_end: Callable[[int], int] = lambda t: t,
    keep: Callable[[Event], bool] = lambda e: True,
    dedup: bool = False,
) -> Outcome:
    o = Outcome()
    watermark, newest = 0, None
    state: dict[str, int] = {}  # dedup key -> expires at
    for r, rows in enumerate(rounds):
        o.watermarks.append(watermark)
        state = {k: v for k, v in state.items() if v > watermark}
        for i, e in enumerate(rows):
            if not keep(e):
                o.filtered.append(e)
                continue
            if watermark > 0 and late_end(e.t) <= watermark:
                o.late.append((e, watermark))
                continue
            o.accepted.append(e)
            o.accepted_at.add((r, i))
            if dedup:
                if e.id in state:
                    continue
                state[e.id] = e.t + delay_ms
            o.kept.append(e)
        top = max(e.t for e in rows)
        newest = top if newest is None else max(newest, top)
        watermark = max(watermark, newest - delay_ms)
    o.final_watermark = watermark
    return o


def tumbling_end(size_ms: int) -> Callable[[int], int]:
    return lambda t: t - t % size_ms + size_ms


def sliding_end(size_ms: int, slide_ms: int) -> Callable[[int], int]:
    return lambda t: t - t % slide_ms + size_ms


def tumbling_counts(
    events: list[Event], size_ms: int, key: Callable[[Event], str]
) -> dict[tuple[int, str], list[Event]]:
    out: dict[tuple[int, str], list[Event]] = defaultdict(list)
    for e in events:
        out[(e.t - e.t % size_ms, key(e))].append(e)
    return out


def sliding_counts(
    rounds: list[list[Event]], outcome: Outcome, size_ms: int, slide_ms: int, key: Callable[[Event], str]
) -> dict[tuple[int, str], int]:
    """Rows per sliding window, counting a row only in windows still open (end after the
    watermark) when it arrived: Spark drops a row from the windows that had closed."""
    counts: dict[tuple[int, str], int] = defaultdict(int)
    for r, (rows, watermark) in enumerate(zip(rounds, outcome.watermarks, strict=True)):
        for i, e in enumerate(rows):
            if (r, i) not in outcome.accepted_at:
                continue
            start = e.t - e.t % slide_ms
            while start + size_ms > e.t:
                if watermark == 0 or start + size_ms > watermark:
                    counts[(start, key(e))] += 1
                start -= slide_ms
    return counts


def sessions(events: list[Event], gap_ms: int) -> list[tuple[str, int, int, int]]:
    """(actor, first, last, events) of every session: consecutive events closer than the gap."""
    by_actor: dict[str, list[int]] = defaultdict(list)
    for e in events:
        by_actor[e.actor].append(e.t)
    out = []
    for actor, times in by_actor.items():
        times.sort()
        first = last = times[0]
        n = 1
        for t in times[1:]:
            if t < last + gap_ms:
                last, n = t, n + 1
            else:
                out.append((actor, first, last, n))
                first = last = t
                n = 1
        out.append((actor, first, last, n))
    return sorted(out)


def iso(ms: int) -> datetime:
    return datetime(1970, 1, 1) + timedelta(milliseconds=ms)


# --- the expected tables of the shipped example shapes -----------------------------------------

DELAY = 10 * MINUTE


def expected_pushes(rounds: list[list[Event]]) -> tuple[dict[tuple[int, str], tuple[int, int]], Outcome]:
    """Pushes per repository per 10-minute window, one per event id: (start, repo) ->
    (pushes, commits), the windows the final watermark has closed."""
    size = 10 * MINUTE
    # Deduplication runs first and drops rows by their own event time, windows or not.
    outcome = run(rounds, DELAY, keep=lambda e: e.type == "PushEvent", dedup=True)
    windows = tumbling_counts(outcome.kept, size, key=lambda e: e.repo)
    want = {
        key: (len(es), sum(e.size for e in es))
        for key, es in windows.items()
        if key[0] + size <= outcome.final_watermark
    }
    return want, outcome


def expected_sessions(rounds: list[list[Event]]) -> tuple[list[tuple[str, int, int, int]], Outcome]:
    """Sessions per actor (10-minute gap) of distinct events, the closed ones."""
    outcome = run(rounds, DELAY, dedup=True)
    closed = [s for s in sessions(outcome.kept, DELAY) if s[2] + DELAY <= outcome.final_watermark]
    return closed, outcome


def session_windows(
    rounds: list[list[Event]], gap_ms: int, delay_ms: int, key: Callable[[Event], str]
) -> tuple[list[tuple[str, int, int, int]], Outcome]:
    """Spark's session_window, batch by batch: a row that is not late joins every open
    session of its key that its own window [t, t + gap) overlaps; a session is written (and
    forgotten) once the watermark reaches its end. A row arriving after its session was
    written starts a new one, as in Spark."""
    outcome = run(rounds, delay_ms, late_end=lambda t: t + gap_ms)
    open_: dict[str, list[list[int]]] = defaultdict(list)  # key -> [start, end, rows]
    written: list[tuple[str, int, int, int]] = []
    after = [*outcome.watermarks[1:], outcome.final_watermark]
    for r, (rows, next_watermark) in enumerate(zip(rounds, after, strict=True)):
        for i, e in enumerate(rows):
            if (r, i) not in outcome.accepted_at:
                continue
            start, end, n = e.t, e.t + gap_ms, 1
            keep = []
            for s in open_[key(e)]:
                if s[0] < end and start < s[1]:
                    start, end, n = min(start, s[0]), max(end, s[1]), n + s[2]
                else:
                    keep.append(s)
            open_[key(e)] = [*keep, [start, end, n]]
        for k, sessions in open_.items():
            written += [(k, s[0], s[1], s[2]) for s in sessions if s[1] <= next_watermark]
            open_[k] = [s for s in sessions if s[1] > next_watermark]
    return sorted(written), outcome
