"""Index vectors (``vectors/index.json``): DESIGN §3, SEMANTICS §2, random sequences.

Token counts are tokens, slots integer indices. DESIGN §3 values are checked while
recording (:class:`~reference.conformance.vectors_record.DesignDrift` if the reference disagrees).
"""

from __future__ import annotations

import json
import random
from typing import Any

from reference.conformance.protocol import Response
from reference.conformance.vectors_record import Recorder, error, ref, result, single
from reference.eviction import POLICIES as EVICTION_POLICIES

MODEL = "model"
PROMPT = list(range(64))


class IndexCase(Recorder):
    """A recorder with shorthands for one index bound as ``"i"`` (and more by name)."""

    def new(self, capacity: int, bind: str = "i", **options: Any) -> Response:
        return self.step("index.new", {"capacity": capacity, **options}, bind=bind)

    def op(
        self, op: str, index: str = "i", expect: Any = None, bind: str | None = None, **args: Any
    ) -> Response:
        return self.step(f"index.{op}", {"index": ref(index), **args}, expect=expect, bind=bind)

    def reserve(
        self,
        tokens: int,
        prompt: Any = None,
        bind: str | None = None,
        index: str = "i",
        **args: Any,
    ) -> Response:
        name = bind or f"r{len(self.steps) + 1}"
        return self.op(
            "reserve",
            index,
            bind=name,
            namespace=args.pop("namespace", MODEL),
            prompt=PROMPT if prompt is None else prompt,
            tokens=tokens,
            **args,
        )

    def write(self, tokens: int, prompt: Any = None, index: str = "i", **args: Any) -> None:
        """Reserve and publish (the seed's ``slot_for_write``)."""
        name = f"w{len(self.steps) + 1}"
        outcome = self.reserve(tokens, prompt, bind=name, index=index, **args).result
        if outcome.get("type") == "reservation":
            self.op("publish", index, expect=result(True), reservation=ref(name))

    def lookup(
        self, minimum: int, maximum: int, prompt: Any = None, expect: Any = None, **args: Any
    ) -> Response:
        return self.op(
            "lookup",
            expect=expect,
            namespace=args.pop("namespace", MODEL),
            prompt=PROMPT if prompt is None else prompt,
            minimum=minimum,
            maximum=maximum,
            **args,
        )

    def snapshot(self, capacity: int, first_slot: int = 0, pins: bool = True) -> None:
        """Observe every slot: free count, states and (with ``pins``) pin counts."""
        self.op("free_count")
        for slot in range(first_slot, first_slot + capacity):
            self.op("slot_state", slot=slot)
            if pins:
                self.op("pins", slot=slot)


def hit(tokens: int, slot: int) -> dict[str, Any]:
    return result({"tokens": tokens, "slot": slot})


def changed(position: int, value: int) -> list[int]:
    prompt = list(PROMPT)
    prompt[position] = value
    return prompt


def _seed_cases() -> list[Recorder]:
    longest = IndexCase("design-3/seed: longest match above the replay point", "DESIGN §3 L2")
    longest.new(3, first_slot=4)
    for tokens in (16, 32, 48):
        longest.write(tokens)
    longest.lookup(20, 48, expect=hit(48, 6))
    longest.lookup(20, 48, changed(40, 7), expect=hit(32, 5))
    lru = IndexCase("design-3/seed: write 48 evicts the least recent", "DESIGN §3 E1")
    lru.new(2, first_slot=8)
    lru.write(16)
    lru.write(32)
    lru.lookup(0, 16, expect=hit(16, 8))
    lru.write(48)
    lru.lookup(16, 32, expect=result(None))
    lru.lookup(32, 48, expect=hit(48, 9))
    return [longest, lru]


def _semantics_cases() -> list[Recorder]:
    cases: list[Recorder] = []

    def case(name: str, source: str) -> IndexCase:
        recorder = IndexCase(f"semantics-2/{name}", f"SEMANTICS {source}")
        cases.append(recorder)
        return recorder

    c = case("lookup bounds: exclusive below, inclusive above", "§2.2 L1")
    c.new(4)
    c.write(32)
    c.lookup(32, 64)
    c.lookup(31, 32)
    c.lookup(10, 10)
    c.lookup(0, 64, PROMPT[:31])

    c = case("namespaces and extras separate keys", "§2.1 K1")
    c.new(4)
    c.write(32)
    c.lookup(0, 64, namespace="other-model")
    c.lookup(0, 64, extras=["lora-7"])
    c.write(32, extras=["lora-7"])
    c.lookup(0, 64, extras=["lora-7"])
    c.op("make_key", namespace=MODEL, prompt=PROMPT, tokens=32, extras=["lora-7"])

    c = case("positions off the hash unit are keys", "§2.1 K3")
    c.new(4, hash_unit=16)
    c.write(20)
    c.lookup(0, 64)
    c.lookup(0, 64, changed(19, 1000))
    c.lookup(0, 64, changed(25, 1000))

    c = case("a hashed prompt gives the keys of its token list", "§2.1 K2")
    c.new(4, hash_unit=16)
    c.write(48)
    hashed = {"tokens": PROMPT, "namespace": MODEL, "extras": [], "unit": 16}
    c.lookup(0, 64, hashed)
    c.lookup(0, 64, {**hashed, "unit": 8})
    c.lookup(0, 64, {**hashed, "namespace": "other"})

    for unit in (1, 3, 16):
        c = case(f"longest published prefix, hash unit {unit}", "§2.2 L1")
        c.new(8, hash_unit=unit)
        prompt = [(7 * i) % 4 for i in range(80)]
        for tokens in (5, 17, 48, 64, 79):
            c.write(tokens, prompt)
        for minimum, maximum in ((0, 90), (0, 63), (17, 48), (47, 47), (64, 78), (0, 4)):
            c.lookup(minimum, maximum, prompt)

    c = case("lookup never returns an unpublished entry", "§2.3 R2")
    c.new(2)
    c.reserve(32, bind="r")
    c.op("slot_state", slot=0)
    c.lookup(0, 64)
    c.op("publish", reservation=ref("r"))
    c.lookup(0, 64)

    c = case("abort returns the slot and hides the key", "§2.3 R2")
    c.new(1)
    c.reserve(32, bind="r")
    c.op("abort", reservation=ref("r"))
    c.op("free_count")
    c.lookup(0, 64)
    c.reserve(32)

    c = case("reserve of a cached key does not hand out its slot", "§2.3 R1")
    c.new(2)
    c.reserve(32, bind="r")
    c.reserve(32)
    c.op("publish", reservation=ref("r"))
    c.reserve(32)
    c.op("free_count")

    c = case("no slot is a normal outcome", "§2.3 R1")
    c.new(2)
    c.reserve(16, bind="a")
    c.reserve(32, bind="b")
    c.reserve(48)
    c.op("publish", reservation=ref("a"))
    c.reserve(48)

    c = case("pinned slots are not evicted", "§2.4 P2")
    c.new(2)
    c.write(16)
    c.reserve(32)
    c.op("pin", slot=0)
    c.reserve(48)
    c.op("unpin", slot=0)
    c.reserve(48)

    c = case("reserve takes the lowest free slot", "§2.3 R1")
    c.new(3)
    for tokens, name in ((16, "a"), (32, "b"), (48, "c")):
        c.reserve(tokens, bind=name)
    c.op("abort", reservation=ref("c"))
    c.op("abort", reservation=ref("a"))
    c.reserve(40)
    c.reserve(24)

    c = case("invalidate of a pinned entry frees its slot at the last unpin", "§2.4 P3")
    c.new(1)
    c.write(32)
    c.op("pin", slot=0)
    c.op("pin", slot=0)
    c.op("make_key", bind="k", namespace=MODEL, prompt=PROMPT, tokens=32)
    c.op("invalidate", key=ref("k"))
    c.op("slot_state", slot=0)
    c.lookup(0, 64)
    c.reserve(16)
    c.op("unpin", slot=0)
    c.op("unpin", slot=0)
    c.op("free_count")
    c.op("slot_state", slot=0)

    c = case("invalidate during the write discards it", "§2.4 P3")
    c.new(1)
    c.reserve(32, bind="r")
    c.op("make_key", bind="k", namespace=MODEL, prompt=PROMPT, tokens=32)
    c.op("invalidate", key=ref("k"))
    c.op("free_count")
    c.op("publish", reservation=ref("r"))
    c.op("free_count")
    c.lookup(0, 64)
    c.op("invalidate", key=ref("k"))

    c = case("clear empties the index but waits for readers", "§2.4 P3")
    c.new(3)
    c.write(16)
    c.write(32)
    c.reserve(48, bind="open")
    c.op("pin", slot=0)
    c.op("clear")
    c.lookup(0, 64)
    c.op("free_count")
    c.op("unpin", slot=0)
    c.op("free_count")
    c.op("publish", reservation=ref("open"))
    c.op("free_count")

    for eviction in ("lru", "fifo"):
        c = case(f"{eviction}: fill, hit the oldest, write", "§2.5 E1, E2")
        c.new(2, eviction=eviction)
        c.write(16)
        c.write(32)
        c.lookup(0, 16)
        c.write(48)
        c.lookup(0, 32)

    def sized(*tokens: int) -> None:
        for t in tokens:
            c.write(t, cost={"tokens": t, "bytes": 10, "flops_saved": 0.0})

    c = case("size-aware evicts the entry worth least per byte", "§2.5 E3")
    c.new(2, eviction="size-aware")
    sized(48, 16, 32)
    c.lookup(0, 20)
    c.lookup(0, 64)
    c = case("size-aware ages old entries out", "§2.5 E3")
    c.new(2, eviction="size-aware")
    sized(48, 16, 40, 8)
    c.lookup(0, 64, expect=hit(40, 1))
    c.lookup(0, 8, expect=hit(8, 0))
    c = case("size-aware hit re-prices the entry", "§2.5 E3")
    c.new(2, eviction="size-aware")
    sized(16, 48, 40)
    c.lookup(44, 48, expect=hit(48, 1))
    sized(8)
    c.lookup(0, 64, expect=hit(48, 1))
    c = case("size-aware never lowers L", "§2.5 E3")
    c.new(2, eviction="size-aware")
    for tokens, size in ((4, 4), (8, 4)):  # H = 1 in slot 0, H = 2 in slot 1
        c.write(tokens, cost={"tokens": tokens, "bytes": size, "flops_saved": 0.0})
    c.op("pin", slot=0)
    c.write(12, cost={"tokens": 12, "bytes": 8, "flops_saved": 0.0})  # evicts H = 2: L = 2
    c.op("unpin", slot=0)
    c.write(16, cost={"tokens": 16, "bytes": 8, "flops_saved": 0.0})  # evicts H = 1: L stays 2
    c.write(20, cost={"tokens": 20, "bytes": 20, "flops_saved": 0.0})  # evicts 12 (3.5 < 4)
    c.lookup(12, 16, expect=hit(16, 0))

    for alpha, survivor in ((0.0, 32), (5.0, 16)):
        c = case(f"flop-aware alpha={alpha} weighs FLOPs saved against recency", "§2.5 E4")
        c.new(2, eviction="flop-aware", params={"alpha": alpha})
        for tokens, flops in ((16, 1e12), (32, 1e9), (48, 1e9)):
            c.write(tokens, cost={"tokens": tokens, "bytes": 1, "flops_saved": flops})
        c.lookup(0, 47, expect=hit(survivor, 0 if survivor == 16 else 1))
    c = case("flop-aware alpha=0 counts hits as use", "§2.5 E4")
    c.new(2, eviction="flop-aware", params={"alpha": 0.0})
    c.write(16)
    c.write(32)
    c.lookup(0, 16)
    c.write(48)
    c.lookup(0, 32, expect=hit(16, 0))
    c.lookup(32, 64, expect=hit(48, 1))

    c = case("a reservation from another index is rejected", "§2.3 R3")
    c.new(2, bind="first")
    c.new(2, bind="second")
    c.reserve(16, bind="r", index="first")
    c.op("publish", index="second", reservation=ref("r"), expect=error("ForeignReservationError"))
    c.op("free_count", index="second")
    c.op("publish", index="first", reservation=ref("r"))

    for options, expected in (
        ({"capacity": 0}, "InvalidConfigError"),
        ({"capacity": 2, "first_slot": -1}, "InvalidConfigError"),
        ({"capacity": 2, "hash_unit": 0}, "InvalidConfigError"),
        ({"capacity": 2, "eviction": "lur"}, "UnknownPolicyError"),
        (
            {"capacity": 2, "eviction": "flop-aware", "params": {"alpha": -1.0}},
            "InvalidConfigError",
        ),
        (
            {"capacity": 2, "eviction": "flop-aware", "params": {"alpha": "NaN"}},
            "InvalidConfigError",
        ),
    ):
        cases.append(
            single(
                f"semantics-2/bad configuration {json.dumps(options)}",
                "SEMANTICS §2.6 S2",
                "index.new",
                options,
                error(expected),
            )
        )
    return cases


#: SEMANTICS §2.6 S2: misuse on an index holding slot 0 published, slot 1 published and
#: pinned, slot 2 reserved, slots 3 and 4 free; (name, op, args, error).
MISUSES: list[tuple[str, str, dict[str, Any], str]] = [
    ("negative tokens", "reserve", {"tokens": -16}, "InvalidTokenCountError"),
    ("zero tokens", "reserve", {"tokens": 0}, "InvalidTokenCountError"),
    ("float tokens", "reserve", {"tokens": 16.0}, "InvalidTokenCountError"),
    ("bool tokens", "reserve", {"tokens": True}, "InvalidTokenCountError"),
    ("tokens past the prompt", "reserve", {"tokens": 65}, "InvalidTokenCountError"),
    ("non-int token id", "reserve", {"prompt": [1, 2, "x"], "tokens": 2}, "InvalidTokenCountError"),
    ("cost that is not an EntryCost", "reserve", {"tokens": 24, "cost": 24}, "InvalidConfigError"),
    (
        "cost of other tokens",
        "reserve",
        {"tokens": 24, "cost": {"tokens": 16}},
        "InvalidConfigError",
    ),
    (
        "zero cost bytes",
        "reserve",
        {"tokens": 24, "cost": {"tokens": 24, "bytes": 0}},
        "InvalidConfigError",
    ),
    (
        "NaN flops saved",
        "reserve",
        {"tokens": 24, "cost": {"tokens": 24, "bytes": 1, "flops_saved": "NaN"}},
        "InvalidConfigError",
    ),
    (
        "negative flops saved",
        "reserve",
        {"tokens": 24, "cost": {"tokens": 24, "bytes": 1, "flops_saved": -1.0}},
        "InvalidConfigError",
    ),
    ("negative minimum", "lookup", {"minimum": -1, "maximum": 8}, "InvalidTokenCountError"),
    ("string maximum", "lookup", {"minimum": 0, "maximum": "8"}, "InvalidTokenCountError"),
    ("minimum above maximum", "lookup", {"minimum": 32, "maximum": 16}, "InvalidRangeError"),
    (
        "namespace that is not a string",
        "lookup",
        {"namespace": 7, "minimum": 0, "maximum": 8},
        "InvalidConfigError",
    ),
    ("invalidate of a lookup hit", "invalidate", {"key": [32, 1]}, "InvalidConfigError"),
    ("pin of an unknown slot", "pin", {"slot": 99}, "SlotOutOfRangeError"),
    ("unpin of a negative slot", "unpin", {"slot": -1}, "SlotOutOfRangeError"),
    ("slot state of a float slot", "slot_state", {"slot": 1.0}, "SlotOutOfRangeError"),
    ("pin of a free slot", "pin", {"slot": 3}, "SlotStateError"),
    ("pin of a reserved slot", "pin", {"slot": 2}, "SlotStateError"),
    ("unpin below zero", "unpin", {"slot": 0}, "PinUnderflowError"),
]


def _misuse_cases() -> list[Recorder]:
    cases: list[Recorder] = []
    for name, op, args, expected in MISUSES:
        c = IndexCase(f"semantics-2.6/misuse: {name}", "SEMANTICS §2.6 S2")
        c.new(5)
        c.write(16)
        c.write(32)
        c.op("pin", slot=1)
        c.reserve(8, bind="open")
        full = dict(args)
        if op in ("reserve", "lookup"):
            full.setdefault("namespace", MODEL)
            full.setdefault("prompt", PROMPT)
        c.op(op, expect=error(expected), **full)
        c.snapshot(5)
        c.lookup(0, 47, expect=hit(32, 1))
        c.lookup(0, 16, expect=hit(16, 0))
        cases.append(c)
    for name, first, second, expected in (
        ("double publish", "publish", "publish", "AlreadyPublishedError"),
        ("abort after publish", "publish", "abort", "AlreadyPublishedError"),
        ("publish after abort", "abort", "publish", "AlreadyAbortedError"),
        ("double abort", "abort", "abort", "AlreadyAbortedError"),
    ):
        c = IndexCase(f"semantics-2.6/misuse: {name}", "SEMANTICS §2.3 R3")
        c.new(5)
        c.reserve(48, bind="r")
        c.op(first, reservation=ref("r"))
        c.op(second, reservation=ref("r"), expect=error(expected))
        c.snapshot(5)
        cases.append(c)
    return cases


# --- random sequences -----------------------------------------------------------------


def _random_prompts(rng: random.Random) -> list[list[int]]:
    base = [rng.randint(0, 3) for _ in range(24)]
    prompts = [base]
    for position in (rng.randint(4, 12), rng.randint(13, 23)):
        other = list(base)
        other[position] = 9
        prompts.append(other)
    return prompts


def _random_index_case(eviction: str, seed: int, full: bool, steps: int = 60) -> Recorder:
    """Random operations, misuse included; ``full`` adds pins, invalidation and clearing."""
    rng = random.Random(f"index/{eviction}/{seed}/{full}")
    kind = "full" if full else "core"
    c = IndexCase(f"random/index/{eviction}/{kind}/seed {seed}", f"seed {seed}")
    capacity, first = rng.randint(2, 4), rng.randint(0, 5)
    unit = rng.choice([1, 4, 8])
    options: dict[str, Any] = {"first_slot": first, "eviction": eviction, "hash_unit": unit}
    if eviction == "flop-aware":
        options["params"] = {"alpha": rng.choice([0.0, 1.0, 5.0])}
    c.new(capacity, **options)
    prompts = _random_prompts(rng)
    reservations: list[str] = []  # every reservation handed out, by bound name
    unsettled: list[str] = []  # not yet published or aborted (as far as the sequence knows)
    slots_of: dict[str, int] = {}
    published: list[int] = []  # slots published at some point (candidates for pins)
    pinned: list[int] = []

    def pick_prompt() -> dict[str, Any]:
        args: dict[str, Any] = {"prompt": rng.choice(prompts)}
        if rng.random() < 0.1:
            args["namespace"] = "other"
        if rng.random() < 0.1:
            args["extras"] = ["lora"]
        return args

    def slot(likely: list[int]) -> int:
        if likely and rng.random() < 0.7:
            return rng.choice(likely)
        return rng.randint(first - 1, first + capacity)  # one out of range on each side

    ops: list[tuple[str, float]] = [
        ("reserve", 25),
        ("publish", 20),
        ("abort", 5),
        ("lookup", 22),
        ("observe", 8),
        ("bad", 3),
    ]
    if full:
        ops += [("pin", 8), ("unpin", 7), ("invalidate", 4), ("clear", 1)]
    names, weights = zip(*ops, strict=True)
    for _ in range(steps):
        choice = rng.choices(names, weights)[0]
        if choice == "reserve":
            tokens = rng.choice([unit, 2 * unit, 3 * unit, rng.randint(1, 24)])
            args = pick_prompt()
            if eviction in ("size-aware", "flop-aware") and rng.random() < 0.7:
                args["cost"] = {
                    "tokens": tokens,
                    "bytes": rng.randint(1, 16),
                    "flops_saved": float(rng.choice([0, 1, 5, 20])) * 1e9,
                }
            name = f"r{len(reservations) + 1}"
            outcome = c.reserve(tokens, bind=name, **args).result
            if isinstance(outcome, dict) and outcome.get("type") == "reservation":
                reservations.append(name)
                unsettled.append(name)
                slots_of[name] = outcome["slot"]
        elif choice in ("publish", "abort") and reservations:
            pool = unsettled if unsettled and rng.random() < 0.8 else reservations
            name = rng.choice(pool)
            response = c.op(choice, reservation=ref(name))
            if name in unsettled:
                unsettled.remove(name)
            if response.ok and response.result is True:
                published.append(slots_of[name])
        elif choice == "lookup":
            minimum = rng.randint(0, 20)
            maximum = rng.randint(minimum, 30)
            if rng.random() < 0.1:
                minimum, maximum = maximum + 1, minimum  # reversed: InvalidRangeError
            c.lookup(minimum, maximum, **pick_prompt())
        elif choice == "observe":
            what = rng.choice(["free_count", "slot_state", "pins"][: 3 if full else 2])
            if what == "free_count":
                c.op(what)
            else:
                c.op(what, slot=slot(published))
        elif choice == "bad":
            c.reserve(rng.choice([0, -1, 25]), **pick_prompt())
        elif choice == "pin":
            target = slot(published)
            if c.op("pin", slot=target).ok:
                pinned.append(target)
        elif choice == "unpin":
            target = slot(pinned)
            if c.op("unpin", slot=target).ok:
                pinned.remove(target)
        elif choice == "invalidate":
            name = f"k{len(c.steps) + 1}"
            tokens = rng.choice([unit, 2 * unit, rng.randint(1, 24)])
            prompt = rng.choice(prompts)
            c.op("make_key", bind=name, tokens=tokens, namespace=MODEL, prompt=prompt)
            c.op("invalidate", key=ref(name))
        elif choice == "clear":
            c.op("clear")
    c.snapshot(capacity, first, pins=full)
    return c


def index_cases() -> list[Recorder]:
    """DESIGN §3 seed vectors, SEMANTICS §2 rules and misuse, random sequences."""
    cases = _seed_cases() + _semantics_cases() + _misuse_cases()
    for eviction in sorted(EVICTION_POLICIES):
        cases.append(_random_index_case(eviction, 0, full=False))
        for seed in range(3):
            cases.append(_random_index_case(eviction, seed, full=True))
    return cases
