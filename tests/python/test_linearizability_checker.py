"""The linearizability checker itself: it must accept what a register may do and catch
what it may not, or the LWT nemesis test proves nothing."""

from linearizability import Operation, check


def op(kind, invoked, completed, value=None, expected=None, result=None):
    return Operation(kind, invoked, completed, value=value, expected=expected, result=result)


def test_a_sequential_history_is_linearizable():
    history = [op("write", 0, 1, value=1), op("read", 2, 3, result=1),
               op("cas", 4, 5, expected=1, value=2, result=True), op("read", 6, 7, result=2)]
    assert check(history)


def test_a_read_of_an_overwritten_value_after_the_write_completed_is_caught():
    history = [op("write", 0, 1, value=1), op("write", 2, 3, value=2), op("read", 4, 5, result=1)]
    assert not check(history)


def test_a_read_concurrent_with_a_write_may_see_either_value():
    for seen in (1, 2):
        history = [op("write", 0, 1, value=1), op("write", 2, 6, value=2), op("read", 3, 4, result=seen)]
        assert check(history)


def test_two_successful_cas_from_the_same_value_are_caught():
    history = [op("write", 0, 1, value=0),
               op("cas", 2, 5, expected=0, value=1, result=True),
               op("cas", 3, 6, expected=0, value=2, result=True)]
    assert not check(history)


def test_a_failed_cas_must_have_seen_another_value():
    assert not check([op("write", 0, 1, value=0), op("cas", 2, 3, expected=0, value=1, result=False)])
    assert check([op("write", 0, 1, value=5), op("cas", 2, 3, expected=0, value=1, result=False)])


def test_an_unknown_write_may_take_effect_late_or_never_but_not_undo_itself():
    unknown = op("write", 0, None, value=7)
    assert check([unknown, op("read", 1, 2, result=None), op("read", 3, 4, result=7)])
    assert check([op("write", 0, None, value=7), op("read", 1, 2, result=None)])
    # Once seen, a value cannot disappear again without a write.
    assert not check([op("write", 0, None, value=7), op("read", 1, 2, result=7), op("read", 3, 4, result=None)])


def test_a_lost_acknowledged_cas_is_caught():
    history = [op("write", 0, 1, value=0), op("cas", 2, 3, expected=0, value=1, result=True),
               op("read", 4, 5, result=0)]
    assert not check(history)


def test_many_unknown_writes_are_searched_within_the_bound():
    """Forty writes whose outcome is unknown (a long outage), then a read that nothing
    explains: the search must say so, not give up."""
    history = [op("write", i, None, value=1 + i % 4) for i in range(40)]
    history += [op("write", 50, 51, value=9), op("read", 52, 53, result=0)]
    assert not check(history, initial=5, max_states=200_000)
    # The same outage followed by reads any of those writes explains.
    history[-1] = op("read", 52, 53, result=3)
    assert check(history, initial=5, max_states=200_000)
