"""Reading a stall's stacks (clusterjob.runner.stacks): faulthandler's dumps (and py-spy's,
written as faulthandler writes them) parsed, where each main thread is, the culprit named
in one line (a stopped rank first, its state named), and a dump shown main thread first."""

from __future__ import annotations

import json
import os

from clusterjob.health import pyspy, stackdump
from clusterjob.runner import stacks
from clusterjob.runner.stacks import RankDump

TORCH = "/env/lib/python3.11/site-packages/torch"
MAIN = 0x00007F8FA2CA2B80


def dump(*frames: tuple, main: int = MAIN, other: bool = True) -> str:
    """A faulthandler dump: a helper thread, then the main thread as the current one."""
    lines = []
    if other:
        lines += ["Thread 0x00007f8edeffd6c0 (most recent call first):",
                  '  File "/usr/lib/python3.11/threading.py", line 331 in wait', ""]
    lines.append(f"Current thread 0x{main:016x} (most recent call first):")
    lines += [f'  File "{file}", line {line} in {func}' for file, line, func in frames]
    return "\n".join(lines) + "\n"


def all_reduce_at(script: str, line: int) -> str:
    return dump((f"{TORCH}/distributed/distributed_c10d.py", 3913, "all_reduce"),
                (f"{TORCH}/distributed/c10d_logger.py", 83, "wrapper"), (script, line, "<module>"))


def test_a_dump_parses_into_threads_with_the_main_one_found(tmp_path):
    threads = stacks.parse(dump(("/p/train.py", 40, "<module>")))
    assert [(t.ident, t.current, len(t.frames)) for t in threads] == [(0x7F8EDEFFD6C0, False, 1), (MAIN, True, 1)]
    assert stacks.main_thread(threads, MAIN).frames[0] == stacks.Frame("/p/train.py", 40, "<module>")
    # the signal may land on another thread: the main one is found by its id
    swapped = dump(("/p/train.py", 40, "<module>")).replace("Current thread", "Thread").replace(
        "Thread 0x00007f8edeffd6c0", "Current thread 0x00007f8edeffd6c0")
    assert stacks.main_thread(stacks.parse(swapped), MAIN).ident == MAIN


def test_only_the_last_of_several_dumps_counts():
    text = dump(("/p/a.py", 1, "old")) + dump(("/p/a.py", 2, "new"))
    threads = stacks.parse(text)
    assert len(threads) == 2 and threads[-1].frames[0].function == "new"


def test_where_a_main_thread_is(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("import time\nfor i in range(3):\n    x = compute(i)\n    time.sleep(3600)\nwhile True: pass\n")
    place = stacks.place(stacks.main_thread(stacks.parse(all_reduce_at(str(script), 3)), MAIN))
    assert (place.collective, place.words()) == (True, "in all_reduce")
    sleeping = stacks.place(stacks.parse(dump((str(script), 4, "<module>")))[-1])
    assert (sleeping.collective, sleeping.words()) == (False, "time.sleep at train.py:4")
    spinning = stacks.place(stacks.parse(dump((str(script), 5, "<module>")))[-1])
    assert spinning.words() == "<module> (while True: pass) at train.py:5"
    # the innermost frame of your own code, not of the library it called into
    queued = stacks.place(stacks.parse(dump(("/usr/lib/python3.11/threading.py", 331, "wait"),
                                            (str(script), 3, "<module>")))[-1])
    assert queued.words() == "compute at train.py:3 (in wait, threading.py:331)"
    backward = stacks.place(stacks.parse(dump((f"{TORCH}/autograd/graph.py", 824, "_engine_run_backward"),
                                              (f"{TORCH}/_tensor.py", 625, "backward"), (str(script), 3, "step")))[-1])
    assert backward.words() == "in backward"
    assert stacks.place(stacks.parse(dump())[-1]) is None  # no Python frame


def test_the_culprit_is_the_rank_outside_a_collective(tmp_path):
    script = str(tmp_path / "train.py")
    (tmp_path / "train.py").write_text("\n" * 39 + "time.sleep(3600)\n")
    dumps = [RankDump(0, "node1", all_reduce_at(script, 41), age_s=30), RankDump(1, "node2", dump((script, 40, "<module>"))),
             RankDump(2, "node3", all_reduce_at(script, 41)), RankDump(3, "node4", all_reduce_at(script, 41))]
    found = stacks.culprit(dumps)
    assert (found.rank, found.host) == (1, "node2")
    assert found.line == "rank 1 on node2: time.sleep at train.py:40; ranks 0,2,3 in all_reduce"


def test_without_one_outside_a_collective_an_ended_rank_then_a_silent_one_then_the_oldest(tmp_path):
    script = str(tmp_path / "t.py")
    waiting = RankDump(0, "n1", all_reduce_at(script, 9), age_s=5)
    ended = RankDump(1, "n2", None, ended=True, age_s=1)
    silent = RankDump(2, "n3", None, why="its watcher did not answer within 15 s")
    assert stacks.culprit([waiting, ended, silent]).line == (
        "rank 1 on n2: its process ended while the others waited; rank 0 in all_reduce; rank 2 gave no stacks")
    assert stacks.culprit([waiting, silent]).line == (
        "rank 2 on n3: no stacks (its watcher did not answer within 15 s); rank 0 in all_reduce")
    broadcast = RankDump(1, "n2", dump((f"{TORCH}/distributed/distributed_c10d.py", 2800, "broadcast")), age_s=9)
    assert stacks.culprit([waiting, broadcast]).line == (
        "rank 1 on n2: in broadcast, its last progress the oldest (9 s); rank 0 in all_reduce at t.py:9; "
        "every rank waits in a collective, each at another call: a deadlock between collectives")


def test_a_deadlock_between_collectives_names_where_each_rank_waits(tmp_path):
    script = str(tmp_path / "t.py")
    first, second = RankDump(0, "n1", all_reduce_at(script, 12), age_s=6), RankDump(1, "n2", all_reduce_at(script, 15),
                                                                                     age_s=7)
    assert stacks.culprit([first, second]).line == (
        "rank 1 on n2: in all_reduce at t.py:15, its last progress the oldest (7 s); rank 0 in all_reduce at t.py:12; "
        "every rank waits in a collective, each at another call: a deadlock between collectives")
    same = [RankDump(0, "n1", all_reduce_at(script, 12), age_s=6), RankDump(1, "n2", all_reduce_at(script, 12))]
    assert stacks.culprit(same).line == (  # one collective that never completes: no deadlock between two
        "rank 0 on n1: in all_reduce at t.py:12, its last progress the oldest (6 s); rank 1 in all_reduce at t.py:12")


def test_the_collective_named_is_the_one_your_code_called(tmp_path):
    script = str(tmp_path / "t.py")
    init = stacks.place(stacks.parse(dump((f"{TORCH}/distributed/distributed_c10d.py", 1900, "_create_gloo_process_group"),
                                          (f"{TORCH}/distributed/distributed_c10d.py", 1950, "_new_process_group_helper"),
                                          (f"{TORCH}/distributed/distributed_c10d.py", 1700, "init_process_group"),
                                          (f"{TORCH}/distributed/c10d_logger.py", 95, "wrapper"),
                                          (script, 4, "<module>")))[-1])
    assert init.words() == "in init_process_group" and init.words(at=True) == "in init_process_group at t.py:4"
    ddp = stacks.place(stacks.parse(dump((f"{TORCH}/nn/parallel/distributed.py", 1600, "_pre_forward"),
                                         (f"{TORCH}/nn/parallel/distributed.py", 1640, "forward"),
                                         (f"{TORCH}/nn/modules/module.py", 1750, "_call_impl"),
                                         (script, 9, "step")))[-1])
    assert (ddp.collective, ddp.words()) == (True, "in DistributedDataParallel.forward")


def test_a_wait_deep_in_a_library_names_the_call_made_and_where_it_waits(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("for step, batch in enumerate(loader):\n    pass\n")
    data = "/env/lib/python3.11/site-packages/torch/utils/data/dataloader.py"
    waiting = stacks.place(stacks.parse(dump(("/usr/lib/python3.11/selectors.py", 415, "select"),
                                             ("/usr/lib/python3.11/multiprocessing/connection.py", 1136, "wait"),
                                             (data, 1243, "_try_get_data"), (data, 733, "__next__"),
                                             (str(script), 1, "<module>")))[-1])
    assert waiting.words() == "enumerate at train.py:1 (in __next__, dataloader.py:733 > ... > select, selectors.py:415)"
    nearer = stacks.place(stacks.parse(dump(("/usr/lib/python3.11/selectors.py", 415, "select"),
                                            (data, 733, "__next__"), (str(script), 1, "<module>")))[-1])
    assert nearer.words() == "enumerate at train.py:1 (in __next__, dataloader.py:733 > select, selectors.py:415)"


def test_many_ranks_in_one_place_are_named_briefly():
    dumps = [RankDump(r, f"n{r}", all_reduce_at("/x.py", 1)) for r in range(12)]
    dumps.append(RankDump(12, "n12", dump(("/nowhere/t.py", 3, "step"))))
    line = stacks.culprit(dumps).line
    assert line == "rank 12 on n12: step at t.py:3; ranks 0,1,2,3,4,5,6,7 and 4 more in all_reduce"
    assert os.path.basename("/nowhere/t.py") in line


def test_a_ranks_place_comes_from_its_own_dump_not_its_childrens(tmp_path):
    worker = f"{stackdump.CHILD_MARK}4243 of rank 1 (a DataLoader worker, say)\n" + dump(("/p/train.py", 13, "__getitem__"))
    found = RankDump(1, "n2", dump(("/p/train.py", 19, "<module>")) + worker)
    assert found.where().frame == stacks.Frame("/p/train.py", 19, "<module>")


def stopped(text: str = "") -> str:
    """A rank's stacks as the watcher writes them when py-spy read them from its stopped process."""
    return (f"# rank 1 on n2, pid 7, main thread 0x{MAIN:016x}; its last progress 30 s before this dump\n"
            f"{stackdump.STATE_MARK}stopped (T)\n# read from outside by py-spy dump --nonblocking: rank 1 (pid 7) is "
            f"stopped (T)\n{text}")


def test_a_stopped_rank_is_the_culprit_wherever_it_stopped_and_its_state_is_named(tmp_path):
    script = str(tmp_path / "train.py")
    (tmp_path / "train.py").write_text("\n" * 39 + "time.sleep(3600)\n")
    waiting = RankDump(0, "n1", all_reduce_at(script, 41), age_s=5)
    outside = RankDump(2, "n3", dump((script, 40, "<module>")), age_s=50)
    in_collective = RankDump(1, "n2", stopped(all_reduce_at(script, 41)), age_s=1)
    assert stacks.culprit([waiting, in_collective, outside]).line == (
        "rank 1 on n2: stopped (T), in all_reduce; rank 0 in all_reduce; rank 2 time.sleep at train.py:40")
    asleep = RankDump(1, "n2", stopped(dump((script, 40, "<module>"))), age_s=1)
    assert stacks.culprit([waiting, asleep]).line == "rank 1 on n2: stopped (T), time.sleep at train.py:40; " \
                                                     "rank 0 in all_reduce"
    no_py_spy = RankDump(1, "n2", stopped("# no stacks: py-spy is not installed\n"))
    assert stacks.culprit([waiting, no_py_spy]).line == "rank 1 on n2: stopped (T), no stacks; rank 0 in all_reduce"
    assert stacks.culprit([outside, no_py_spy]).line == (
        "rank 1 on n2: stopped (T), no stacks; rank 2 time.sleep at train.py:40")
    assert stacks.culprit([asleep, RankDump(0, "n1", stopped(all_reduce_at(script, 41)))]).line == (
        "rank 1 on n2: stopped (T), time.sleep at train.py:40; rank 0 stopped (T), in all_reduce")


def test_a_childs_state_is_not_its_ranks():
    child = f"{stackdump.CHILD_MARK}4243 of rank 1 (a DataLoader worker, say)\n{stackdump.STATE_MARK}stopped (T)\n"
    assert RankDump(1, "n2", dump(("/p/train.py", 19, "<module>")) + child).state == ""
    assert RankDump(1, "n2", stopped(dump(("/p/train.py", 19, "<module>"))) + child).state == "stopped (T)"


def test_stack_shows_the_main_thread_first():
    helper = "Thread 0x00007f8edeffd6c0 (most recent call first):\n  File \"/p/t.py\", line 1 in wait\n"
    main = f"Thread 0x{MAIN:016x} (most recent call first):\n  File \"/p/t.py\", line 9 in <module>\n"
    current = "Current thread 0x00007f8edeffd6c1 (most recent call first):\n  File \"/p/t.py\", line 5 in run\n"
    text = f"# read from outside\n{helper}\n{current}\n{main}"
    assert stackdump.main_first(text, MAIN) == f"# read from outside\n{main}\n{helper}\n{current}"
    assert stackdump.main_first(text, None) == f"# read from outside\n{current}\n{helper}\n{main}"  # the signalled one
    assert stackdump.main_first(f"{helper}\n{main}", 1) == f"{helper}\n{main}"  # unknown: as it was
    assert stackdump.main_first(main, MAIN) == main and stackdump.main_first("", MAIN) == ""


def test_py_spys_threads_read_as_faulthandler_writes_them():
    raw = json.dumps([{"thread_id": 11, "thread_name": "worker", "frames": [
        {"name": "Thread.run", "filename": "/usr/lib/python3.11/threading.py", "line": 982}]},
        {"thread_id": MAIN, "thread_name": "MainThread", "frames": [
            {"name": "<module>", "filename": "/p/train.py", "line": 40}]}])
    text = pyspy.render(raw)
    assert text == ('Thread 0x000000000000000b (most recent call first):\n'
                    '  File "/usr/lib/python3.11/threading.py", line 982 in run\n\n'
                    f'Thread 0x{MAIN:016x} (most recent call first):\n  File "/p/train.py", line 40 in <module>\n')
    (worker, main) = stacks.parse(text)
    assert stacks.main_thread([worker, main], MAIN).frames == (stacks.Frame("/p/train.py", 40, "<module>"),)
    for bad in ("", "not json", "[]", '[{"thread_id": "x", "frames": []}]', '{"a": 1}', "[1]"):
        assert pyspy.render(bad) is None, bad
