"""Slurm host list and tasks-per-node parsing, checked against `scontrol show hostnames`."""

import pytest

from clusterjob.core.hostlist import (
    MAX_RANGE,
    MAX_TASKS_PER_NODE,
    HostlistError,
    expand_hostlist,
    parse_tasks_per_node,
)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("node1", ["node1"]),
        ("node[1-2]", ["node1", "node2"]),
        # The trap of one-bracket regexes: two groups, the leftmost varies slowest.
        (
            "rack[1-2]-n[01-04]",
            [
                "rack1-n01", "rack1-n02", "rack1-n03", "rack1-n04",
                "rack2-n01", "rack2-n02", "rack2-n03", "rack2-n04",
            ],
        ),
        ("a[1-2]b[3-4]c", ["a1b3c", "a1b4c", "a2b3c", "a2b4c"]),
        ("n[08-11]", ["n08", "n09", "n10", "n11"]),
        ("n[098-101]", ["n098", "n099", "n100", "n101"]),
        ("n[8-11]", ["n8", "n9", "n10", "n11"]),
        # Slurm takes the padding from the lower bound only.
        ("n[1-010]", ["n1", "n2", "n3", "n4", "n5", "n6", "n7", "n8", "n9", "n10"]),
        ("n[1-3,7,10-11]", ["n1", "n2", "n3", "n7", "n10", "n11"]),
        ("n[5]", ["n5"]),
        ("gpu[1-2]-ib", ["gpu1-ib", "gpu2-ib"]),
        ("[1-2]x", ["1x", "2x"]),
        ("a,b[1-2],c", ["a", "b1", "b2", "c"]),
        ("n[1-2],m[3,4] x", ["n1", "n2", "m3", "m4", "x"]),
        ("a b\tc\nd", ["a", "b", "c", "d"]),
        ("a, b ,c", ["a", "b", "c"]),
        ("  n1 \n", ["n1"]),
        ("n3,n1,n2", ["n3", "n1", "n2"]),
        ("n1,n1,n[1-2]", ["n1", "n1", "n1", "n2"]),
    ],
)
def test_expand_hostlist(text, expected):
    assert expand_hostlist(text) == expected


@pytest.mark.parametrize(
    "text, offending, words",
    [
        ("n[5-3]", "5-3", "reversed"),
        ("n[1-2", "n[1-2", "never closed"),
        ("n1-2]", "n1-2]", "without a '['"),
        ("n[1-2]]", "n[1-2]]", "without a '['"),
        ("n[[1-2]]", "n[[1-2]]", "nested"),
        ("n[1[2]]", "n[1[2]]", "nested"),
        ("n[]", "n[]", "empty brackets"),
        ("n[a-b]", "a-b", "decimal digits"),
        ("n[1-x]", "1-x", "decimal digits"),
        ("n[1-]", "1-", "decimal digits"),
        ("n[-1]", "-1", "decimal digits"),
        ("n[1 -2]", "1 -2", "decimal digits"),
        ("n[1,,2]", "n[1,,2]", "decimal digits"),
        ("a,,b", "a,,b", "empty name"),
        ("a,", "a,", "empty name"),
        (",a", ",a", "empty name"),
        ("a, ,b", "a, ,b", "empty name"),
        ("", "''", "empty"),
        ("   ", "'   '", "empty"),
        ("n[0-70000]", "0-70000", str(MAX_RANGE)),
        ("node1\x01,node2", "'node1\\x01'", "'\\x01'"),
        ("nod\u00e91", "'nod\u00e91'", "'\u00e9'"),
        ("a\x7f[1-2]", "'a\\x7f[1-2]'", "'\\x7f'"),
        ("n[1-2]\x00x", "'n[1-2]\\x00x'", "'\\x00'"),
        ("n[" + "1" * 19 + "]", "1" * 19, "longer than 18 digits"),
        ("n[1-" + "9" * 5000 + "]", "(5005 characters)", "longer than 18 digits"),
    ],
)
def test_expand_hostlist_errors_name_the_text(text, offending, words):
    with pytest.raises(HostlistError) as caught:
        expand_hostlist(text)
    message = str(caught.value)
    assert offending in message
    assert words in message


def test_hostlist_error_is_a_value_error():
    with pytest.raises(ValueError):
        expand_hostlist("n[5-3]")


def test_expansion_size_is_bounded():
    # Each range alone is legal; their product would be 2**32 names.
    with pytest.raises(HostlistError, match="more than"):
        expand_hostlist("a[1-65536]b[1-65536]")


@pytest.mark.parametrize(
    "text, expected",
    [
        ("2(x3),1", [2, 2, 2, 1]),
        ("2(x2)", [2, 2]),
        ("4", [4]),
        ("1,3(x2),2", [1, 3, 3, 2]),
        ("8(x1)", [8]),
        ("2(x2)\n", [2, 2]),
    ],
)
def test_parse_tasks_per_node(text, expected):
    assert parse_tasks_per_node(text) == expected


@pytest.mark.parametrize(
    "text, offending",
    [
        ("", "''"),
        ("2(x0)", "2(x0)"),
        ("2(3)", "2(3)"),
        ("2(x3", "2(x3"),
        ("x3", "x3"),
        ("2,,1", "''"),
        ("-1", "-1"),
        ("2 (x3)", "2 (x3)"),
        ("two", "two"),
    ],
)
def test_parse_tasks_per_node_errors(text, offending):
    with pytest.raises(HostlistError) as caught:
        parse_tasks_per_node(text)
    assert offending in str(caught.value)
    assert isinstance(caught.value, ValueError)


@pytest.mark.parametrize(
    "text, entry, words",
    [
        ("2,0", "'0'", "gives nodes 0 tasks"),
        ("0(x2)", "'0(x2)'", "gives nodes 0 tasks"),
        ("1,00", "'00'", "gives nodes 0 tasks"),
        ("99999999", "'99999999'", f"more than {MAX_TASKS_PER_NODE} tasks"),
        ("1(x" + "9" * 19 + ")", "'1(x" + "9" * 19 + ")'", "longer than 18 digits"),
        ("1(x" + "9" * 5000 + ")", "'1(x9999", "(5004 characters) has a number longer than 18 digits"),
        ("x2(x2)", "'x2(x2)'", "is not 'N' or 'N(xM)'"),
        ("2(x2)junk", "'2(x2)junk'", "is not 'N' or 'N(xM)'"),
        ("2, 1", "' 1'", "is not 'N' or 'N(xM)'"),
        ("\u0662", "'\u0662'", "is not 'N' or 'N(xM)'"),  # a non-ASCII digit
    ],
)
def test_tasks_per_node_refuses_zero_huge_and_garbage(text, entry, words):
    with pytest.raises(HostlistError) as caught:
        parse_tasks_per_node(text)
    message = str(caught.value)
    assert f"entry {entry}" in message and words in message


def test_huge_repeat_within_bounds_is_counted_not_refused():
    assert parse_tasks_per_node(f"1(x{MAX_TASKS_PER_NODE})") == [1] * MAX_TASKS_PER_NODE
    assert parse_tasks_per_node(f"{MAX_TASKS_PER_NODE}") == [MAX_TASKS_PER_NODE]
