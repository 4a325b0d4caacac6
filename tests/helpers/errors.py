"""Checking that an error teaches: it names the bad value and the way out.

    from helpers.errors import assert_names_value_and_choices

    with pytest.raises(ValueError) as caught:
        create_strategy("mirored")
    assert_names_value_and_choices(caught.value, "mirored", STRATEGY_NAMES)
"""


def assert_names_value_and_choices(error, value, choices):
    """The message of `error` quotes `value` (its repr) and names every one of `choices`.

    Example: `assert_names_value_and_choices(ValueError("'fp8': use one of a, b"), "fp8", "ab")`
    """
    message = str(error)
    assert repr(value) in message, f"the message does not name {value!r}: {message}"
    missing = [choice for choice in choices if choice not in message]
    assert not missing, f"the message does not name {missing}: {message}"
