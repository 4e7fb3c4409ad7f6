"""TextWorldExpress games and their expert, for the example corpus (harnessrl.examples.twx) and
bench/twx.py: the agent's game and a shadow game in two JVMs, the families' gold agents asked
for a continuation from any state, and the three repairs that make their labels hold from
perturbed states (see twx.py's docstring for why each exists)."""

from __future__ import annotations

MAX_STEPS = 40  # our own cap; the env's limit is set well above it
GOLD_TRIES = 4  # scala RNG seeds tried per re-plan (coin/cookingworld agents random-walk)

# Game parameters chosen so gold paths are ~5-25 steps.
FAMILY_PARAMS: dict[str, str] = {
    "cookingworld": "numLocations=3,numIngredients=2,numDistractorItems=5,includeDoors=0,limitInventorySize=0",
    "twc": "numLocations=2,numItemsToPutAway=3,includeDoors=0,limitInventorySize=0",
    "coin": "numLocations=5,numDistractorItems=3,includeDoors=1,limitInventorySize=0",
    "mapreader": "numLocations=8,maxDistanceApart=3,maxDistractorItemsPerLocation=2,includeDoors=0,limitInventorySize=0",
    "arithmetic": "",
    "sorting": "",
    "peckingorder": "",
    "simonsays": "",
}
FAMILIES: tuple[str, ...] = tuple(FAMILY_PARAMS)
_GOLD_AGENT_CLASS = {
    "cookingworld": "CookingWorldGoldAgent",
    "twc": "TWCGoldAgent",
    "coin": "CoinGoldAgent",
    "mapreader": "MapReaderGoldAgent",
    "arithmetic": "ArithmeticGoldAgent",
    "sorting": "SortingGoldAgent",
    "peckingorder": "PeckingOrderGoldAgent",
    "simonsays": "SimonSaysGoldAgent",
}

# Information actions whose content never changes within an episode: once taken, the expert
# never asks for them again. "look around" counts as taken at reset (the reset obs is the look).
INFO_ACTIONS = frozenset({"look around", "task", "read map", "read cookbook", "read math problem"})
# Information actions whose content changes as the task advances (re-read after progress).
REFRESHING_INFO_ACTIONS = frozenset({"read instructions book"})


class _Engine:
    """The agent's env plus a shadow env the expert may replay into and mutate.

    They run in two JVMs on purpose: TWX games keep JVM-global state, and generating or stepping
    a second game in the same JVM silently corrupts the first one (observed: a sorting game whose
    failure state was masked after the shadow replayed it). One engine per fold, so a fold's
    output depends only on its own sequence of calls (``--limit`` stays a prefix).
    """

    def __init__(self) -> None:
        from textworld_express import TextWorldExpressEnv

        self.env = TextWorldExpressEnv(envStepLimit=10 * MAX_STEPS)
        self._shadow_env = TextWorldExpressEnv(envStepLimit=10 * MAX_STEPS)
        self._jvm = self._shadow_env._gateway.jvm
        self._shadow = self._shadow_env.server
        self._shadow_game: tuple[str, str] | None = None
        self.seeds = {
            "train": [int(s) for s in self.env.getValidSeedsTrain()],
            "test": [int(s) for s in self.env.getValidSeedsTest()],
        }
        self.gold_calls = 0
        self.gold_failures = 0  # mkGoldPath calls that returned ok=false
        self.repairs = 0  # continuations found only by the one-step repair

    def close(self) -> None:
        for env in (self.env, self._shadow_env):
            try:
                env.close()
            except Exception:  # pragma: no cover - best effort at shutdown
                pass
            # the env's __del__ closes again, writing to the stopped Java gateway (BrokenPipeError)
            env.close = lambda: None

    def _replay(self, family: str, fold: str, seed: int, history: list[str]):
        params = FAMILY_PARAMS[family]
        if self._shadow_game != (family, params):
            msg = self._shadow.load(family, params)
            if msg:
                raise ValueError(msg)
            self._shadow_game = (family, params)
        self._shadow.generateNewGame(seed, fold, False)
        for action in history:
            self._shadow.step(action)
        return self._shadow.game()

    def plan(
        self,
        family: str,
        fold: str,
        seed: int,
        history: list[str],
        rng_key: int,
        candidates: list[str] | None = None,
    ) -> list[str] | None:
        """The expert's continuation from the state reached by `history`, or None.

        When the gold agent gives up and `candidates` (the valid actions now) are given, try a
        one-step repair: some scripts abort on a state they did not expect (cookingworld's, when
        the agent already holds an ingredient the script wants to take), so look one
        put/take/open action ahead and keep the shortest continuation that works.
        """
        if family == "mapreader":
            return _mapreader_plan(self._replay(family, fold, seed, history))
        plan = self._gold(family, fold, seed, history, rng_key, GOLD_TRIES)
        if plan is not None or not candidates:
            return plan
        best: list[str] | None = None
        for action in candidates:
            if _verb(action) not in _REPAIR_VERBS:
                continue
            rest = self._gold(family, fold, seed, history + [action], rng_key, 1)
            if rest is not None and (best is None or 1 + len(rest) < len(best)):
                best = [action] + rest
        if best is not None:
            self.repairs += 1
        return best

    def _gold(self, family: str, fold: str, seed: int, history: list[str], rng_key: int, tries: int) -> list[str] | None:
        agent_cls = getattr(self._jvm.textworldexpress.goldagent, _GOLD_AGENT_CLASS[family])
        for attempt in range(tries):
            # The gold agent steps the game it is given, so every try starts from a fresh replay.
            game = self._replay(family, fold, seed, history)
            prefix = int(game.history().size())
            self.gold_calls += 1
            result = agent_cls(game).mkGoldPath(self._jvm.scala.util.Random((rng_key * 7 + attempt) % 2**31))
            if not result._1:
                self.gold_failures += 1
                continue
            continuation = [str(a) for a in result._2][prefix:]
            if family == "sorting":
                continuation = _skip_already_boxed(continuation, history)
            if continuation:
                return continuation
        return None


_REPAIR_VERBS = frozenset({"put", "take", "open"})


def _skip_already_boxed(plan: list[str], history: list[str]) -> list[str]:
    """Sorting's gold agent re-sorts every object, including those already in the box: taking
    one out again costs score (and putting it back out of order fails the game). Drop the
    take/put pairs of objects that are in the box already."""
    boxed: set[str] = set()
    for action in history:
        if action.startswith("put ") and action.endswith(" in box"):
            boxed.add(action[len("put ") : -len(" in box")])
        elif action.startswith("take "):
            boxed.discard(action[len("take ") :])
    return [
        a
        for a in plan
        if not (a.startswith("take ") and a[len("take ") :] in boxed)
        and not (a.startswith("put ") and a.endswith(" in box") and a[len("put ") : -len(" in box")] in boxed)
    ]


_DIRECTIONS = ("north", "south", "east", "west")


def _find_object_room(game, name: str):
    """The room holding object `name` (searched through containers), or None."""
    for room in game.locations():
        stack = [room]
        while stack:
            obj = stack.pop()
            contents = obj.contents()
            for i in range(contents.size()):
                child = contents.apply(i)
                if str(child.name()) == name:
                    return room
                stack.append(child)
    return None


def _route(start, goal) -> list[str] | None:
    """Shortest list of "move <dir>" commands between two rooms (breadth first, fixed order)."""
    goal_name = str(goal.name())
    frontier = [(start, [])]
    seen = {str(start.name())}
    while frontier:
        room, path = frontier.pop(0)
        if str(room.name()) == goal_name:
            return path
        for d in _DIRECTIONS:
            nxt = getattr(room, "location" + d.capitalize())()
            if nxt is not None and str(nxt.name()) not in seen:
                seen.add(str(nxt.name()))
                frontier.append((nxt, path + [f"move {d}"]))
    return None


def _mapreader_plan(game) -> list[str] | None:
    """Map reader's expert from any state.

    The packaged gold agent always navigates from the game's *start* room, so after the agent
    has wandered its moves are wrong; this re-implements its script (task, read map, go to the
    coin, take it, go back to the box, put it in) from the agent's current room.
    """
    here = game.agentLocation()
    box_room = _find_object_room(game, "box")
    if box_room is None:
        return None
    plan = ["task", "read map"]
    inventory = game.agentInventory().contents()
    holding_coin = any(str(inventory.apply(i).name()) == "coin" for i in range(inventory.size()))
    if not holding_coin:
        coin_room = _find_object_room(game, "coin")
        if coin_room is None:
            return None
        to_coin = _route(here, coin_room)
        if to_coin is None:
            return None
        plan += to_coin + ["take coin"]
        here = coin_room
    to_box = _route(here, box_room)
    if to_box is None:
        return None
    return plan + to_box + ["put coin in box"]


class _InfoTracker:
    def __init__(self) -> None:
        self.taken = {"look around"}
        self._epoch = 0  # bumps whenever the score changes
        self._read_epoch: dict[str, int] = {}

    def is_stale(self, action: str) -> bool:
        if action in INFO_ACTIONS:
            return action in self.taken
        if action in REFRESHING_INFO_ACTIONS:
            return self._read_epoch.get(action) == self._epoch
        return False

    def record(self, action: str, score_changed: bool) -> None:
        if action in INFO_ACTIONS:
            self.taken.add(action)
        if score_changed:
            self._epoch += 1
        if action in REFRESHING_INFO_ACTIONS:
            self._read_epoch[action] = self._epoch


def _verb(action: str) -> str:
    return action.split(" ", 1)[0]


def _drop_unusable(plan: list[str], candidates: set[str], tracker: _InfoTracker) -> None:
    """Drop leading plan commands that are not valid now or are already-taken information actions."""
    while plan and (plan[0] not in candidates or tracker.is_stale(plan[0])):
        plan.pop(0)


def _gold_key(seed: int, t: int) -> int:
    return (seed * 1009 + t) % 2**31
