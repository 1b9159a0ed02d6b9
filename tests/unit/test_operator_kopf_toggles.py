"""kopf_toggles.py: kopf's readiness ToggleSet wakes its waiters only when its state flips, not at
every toggle made or dropped (quadratic in the objects at start)."""

from __future__ import annotations

import asyncio

from kopf._cogs.aiokits import aiotoggles

from rljob_operator import kopf_toggles


def test_waiters_wake_when_the_set_turns_on_and_only_then() -> None:
    assert kopf_toggles.install()
    assert kopf_toggles.install()  # twice is once

    async def main() -> tuple[int, bool, bool]:
        toggles = aiotoggles.ToggleSet(all)
        notified = 0
        notify_all = toggles._condition.notify_all

        def counting() -> None:
            nonlocal notified
            notified += 1
            notify_all()

        toggles._condition.notify_all = counting  # type: ignore[method-assign]
        blocker = await toggles.make_toggle(name="blocker")  # on -> off: one notification
        objects = [await toggles.make_toggle(name=f"object {i}") for i in range(500)]
        waiters = [asyncio.ensure_future(toggles.wait_for(True)) for _ in range(500)]
        await asyncio.sleep(0)
        for toggle in objects:
            await toggles.drop_toggle(toggle)
        await toggles.drop_toggles([])
        early = any(w.done() for w in waiters)
        await toggles.drop_toggle(blocker)  # off -> on: the waiters wake
        await asyncio.wait_for(asyncio.gather(*waiters), 5)
        return notified, early, toggles.is_on()

    notified, early, on = asyncio.run(main())
    assert not early and on
    assert notified == 2  # kopf's own: one per toggle made or dropped, 1002
