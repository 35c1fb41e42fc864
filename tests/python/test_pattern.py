import pytest

import sparq


def test_parse_and_repr():
    p = sparq.Pattern("2:4")
    assert (p.n, p.m) == (2, 4)
    assert str(p) == "2:4"
    assert repr(p) == "Pattern('2:4')"
    assert p == sparq.Pattern("2:4") and p != sparq.Pattern("4:8")
    assert hash(p) == hash(sparq.Pattern("2:4"))
    assert sparq.Pattern("unstructured:0.9").fraction == pytest.approx(0.9)
    for spec in ["dense", "block:16x16", "vnm:8:2:4", "rows:0.3"]:
        assert str(sparq.Pattern(spec)).startswith(spec.split(":")[0])


@pytest.mark.parametrize("spec", ["3:2", "2:40", "bogus", "", "block:0x4", "unstructured:1.5"])
def test_bad_pattern_raises_value_error(spec):
    with pytest.raises(ValueError) as e:
        sparq.Pattern(spec)
    # the library's message names what it read
    assert spec in str(e.value) or "pattern" in str(e.value)
