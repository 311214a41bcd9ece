"""The built-in behaviour scorers pass the scorer contract, and say what they claim."""

from __future__ import annotations

from kvbridge.builtin.steering import SCORERS
from kvbridge.testing import ScorerContract

BY_NAME = {s.name: s for s in SCORERS}


class TestJsonObject(ScorerContract):
    scorer = BY_NAME["json_object"]
    positives = ('{"name": "cat", "legs": 4}', '```json\n{"a": [1, 2]}\n```', ' {"a": 1} and more text')
    negatives = ('{"name": "cat", "legs"', "The cat has four legs.", "[1, 2, 3]", '"{}"')


class TestJsonStart(ScorerContract):
    scorer = BY_NAME["json_start"]
    positives = ('{"name": "cat", "le', '```json\n{\n  "a"', "{}")
    negatives = ("The cat {", "[1]", "{name: 1}")


class TestBullets(ScorerContract):
    scorer = BY_NAME["bullets"]
    positives = ("Tips:\n- sleep early\n- no coffee", "* one\n* two\n", "\u2022 a\n\u2022 b")
    negatives = ("- only one item", "1. one\n2. two", "-no space\n-here", "plain prose")


class TestPositiveSentiment(ScorerContract):
    scorer = BY_NAME["positive_sentiment"]
    positives = ("What a wonderful, delicious meal!", "I love it.")
    negatives = ("It was bland and boring.", "The food was good but the service was terrible and rude.", "A table.")


class TestNegativeSentiment(ScorerContract):
    scorer = BY_NAME["negative_sentiment"]
    positives = ("It was bland and boring.", "Death and blood.")
    negatives = ("What a wonderful meal!", "A table.")


class TestCodeComments(ScorerContract):
    scorer = BY_NAME["code_comments"]
    positives = (
        "```python\n# add two numbers\ndef add(a, b):\n    return a + b\n```",
        '```python\ndef add(a, b):\n    """Add."""\n    return a + b\n```',
        "```js\nconst x = 1; // one\n```",
        "def f():\n    return 1  # one\n",
    )
    negatives = ("```python\ndef add(a, b):\n    return a + b\n```", "# Heading\n```python\nx = 1\n```")


def test_every_builtin_scorer_has_a_contract_test():
    tested = {"json_object", "json_start", "bullets", "positive_sentiment", "negative_sentiment", "code_comments"}
    assert set(BY_NAME) == tested


def test_a_scorer_that_raises_on_odd_text_fails_the_contract():
    import pytest

    from kvbridge.plugin_types import Scorer
    from kvbridge.testing.steer_contract import check_scorer

    def fragile(text):
        return text[0] == "x"

    with pytest.raises(IndexError):
        check_scorer(Scorer("fragile-contract", "first char is x", fragile), ["xyz"], ["abc"])
