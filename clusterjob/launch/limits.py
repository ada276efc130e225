"""How many jobs the cluster takes (docs/design.md, "Command line": the preflight's
``jobs`` check): a sweep is refused before anything is queued when its jobs would pass
one of the cluster's limits on jobs, each array task counting as one job.

- MaxJobCount (``scontrol show config``): the jobs the controller holds at once, of
  every user, finished ones included until MinJobAge passed; past it sbatch retries
  and waits, or fails. Counted: every job ``squeue -t all`` lists.
- MaxSubmitJobs (MaxSubmit) and GrpSubmitJobs of the user's association (the spec's
  account, else the user's default), and MaxSubmitJobsPerUser, MaxSubmitJobsPerAccount
  and GrpSubmitJobs of the job's QOS (the spec's, else the association's default) and
  of the partition's QOS: the jobs that may be pending or running at once. Counted:
  the jobs of the user (of the account, of everyone) in that association or QOS that
  have not ended. Only where the cluster keeps accounting (AccountingStorageType).

``resources.array_parallelism`` bounds the tasks that run at once, not those queued, so
it helps none of these: the fix is a smaller sweep (the rest once these ended) or
waiting. Read-only, and every answer read by clusterjob.core.slurmctl: a command that
does not answer, or a limit that cannot be read, fails the check with a line that says so.
"""

from __future__ import annotations

import os
import pwd
from dataclasses import dataclass
from typing import Callable, Optional

from clusterjob.core import slurmctl
from clusterjob.core.errors import SlurmUnreachable

QUEUE = "squeue -t all"
QUEUE_CMD = ["squeue", "-r", "-t", "all", "-o", "%i|%u|%a|%q|%T"]
ASSOC = "sacctmgr show assoc"
_SPLIT_FIX = ("resources.array_parallelism does not help (it bounds the tasks that run, and every queued task "
              "counts): ")


@dataclass(frozen=True)
class Limit:
    """One of the cluster's limits on jobs: what it is, its value, the jobs that count
    against it now, and what else the fix may say."""

    name: str
    most: int
    counted: int
    more_fix: str = ""

    def fix(self, points: int) -> str:
        room = max(self.most - self.counted, 0)
        split = f"submit at most {room} point(s) now and the rest once these ended" if room else \
            "wait until jobs already queued end"
        return f"{_SPLIT_FIX}{split}{self.more_fix}"


@dataclass(frozen=True)
class Job:
    """A job (or array task) of ``squeue -t all``, as the submit limits count it."""

    user: str
    account: str
    qos: str
    # In a state of slurmctl.ENDED: it counts for MaxJobCount while the controller holds it, never for a submit limit.
    ended: bool


Ask = Callable[..., Optional[object]]


class Unknown(Exception):
    """A limit or count that cannot be known: the check fails with this line and fix."""

    def __init__(self, line: str, fix: str) -> None:
        super().__init__(line)
        self.line, self.fix = line, fix


def limits(spec_account: Optional[str], spec_qos: Optional[str], partition: str, partition_qos: Optional[str],
           ask: Ask, qos_row: Callable[[str], tuple[Optional[dict], Optional[str]]],
           unanswered_fix: str, unread_fix: str) -> list[Limit]:
    """Every limit on jobs that applies to a job of this spec, with what counts against
    it now; Unknown when an answer is missing or cannot be read."""
    try:
        conf = slurmctl.config(ask)
    except SlurmUnreachable as err:
        raise Unknown(str(err), unanswered_fix) from None
    most = slurmctl.number(conf.get("MaxJobCount"))
    if most is None:
        raise Unknown(slurmctl.unreadable("scontrol show config", "MaxJobCount", conf.get("MaxJobCount")), unread_fix)
    jobs = _queue(ask, unanswered_fix, unread_fix)
    found = [Limit("MaxJobCount (scontrol show config)", most, len(jobs),
                   "; MaxJobCount counts every user's jobs, finished ones until MinJobAge passed")]
    if "slurmdbd" not in conf.get("AccountingStorageType", ""):
        return found  # no accounting: no association nor QOS limits
    user = _user()
    queued = [job for job in jobs if not job.ended]
    account, def_qos, assoc = _association(user, spec_account, partition, conf.get("ClusterName"), ask,
                                           unanswered_fix, unread_fix)
    mine = [job for job in queued if job.user == user]
    for key, label in (("MaxSubmit", "MaxSubmitJobs"), ("GrpSubmit", "GrpSubmitJobs")):
        value = _limit(assoc, key, ASSOC, unread_fix)
        if value is not None:
            found.append(Limit(f"{label} of your association (user {user}, account {account})", value,
                               sum(job.account == account for job in mine)))
    for name in dict.fromkeys(filter(None, (spec_qos or def_qos, partition_qos))):
        found += _qos_limits(name, qos_row, user, account, queued, unanswered_fix, unread_fix)
    return found


def over(points: int, found: list[Limit]) -> Optional[Limit]:
    """The first limit the ``points`` new jobs would pass."""
    return next((limit for limit in found if limit.counted + points > limit.most), None)


def assoc_cmd(user: Optional[str] = None) -> list[str]:
    """The sacctmgr command of the associations of ``user`` (default: this process's)."""
    return ["sacctmgr", "-P", "show", "assoc", "where", f"user={user or _user()}",
            "format=Cluster,Account,Partition,MaxSubmit,GrpSubmit,DefaultQOS"]


def _user() -> str:
    """The user Slurm counts this process's jobs for."""
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return str(os.getuid())


def _queue(ask: Ask, unanswered_fix: str, unread_fix: str) -> list[Job]:
    """Every job the controller holds, each array task apart."""
    done = ask(QUEUE_CMD)
    if done is None or getattr(done, "returncode", 1) != 0:
        raise Unknown(slurmctl.unanswered(QUEUE, done), unanswered_fix)
    text = getattr(done, "stdout", "") or ""
    if not text.startswith("JOBID|"):
        raise Unknown(slurmctl.unreadable(QUEUE, "JOBID", text[:40] or None), unread_fix)
    return [Job(row.get("USER", ""), row.get("ACCOUNT", ""), row.get("QOS", ""), row.get("STATE", "") in slurmctl.ENDED)
            for row in slurmctl.table(text)]


def _association(user: str, account: Optional[str], partition: str, cluster: Optional[str], ask: Ask,
                 unanswered_fix: str, unread_fix: str) -> tuple[str, str, dict]:
    """(account, its default QOS, the association's row) of the user's jobs: the spec's
    account, else the user's only or default one; the row of the partition where there
    is one."""
    done = ask(assoc_cmd(user))
    if done is None or getattr(done, "returncode", 1) != 0:
        raise Unknown(slurmctl.unanswered(ASSOC, done), unanswered_fix)
    rows = [row for row in slurmctl.table(getattr(done, "stdout", "") or "")
            if not cluster or row.get("Cluster") in (cluster, None)]
    accounts = list(dict.fromkeys(row.get("Account", "") for row in rows))
    if account is None:
        account = accounts[0] if len(accounts) == 1 else _default_account(user, ask, unanswered_fix)
    mine = [row for row in rows if row.get("Account") == account]
    row = next((r for r in mine if r.get("Partition") == partition), None) or next(
        (r for r in mine if not r.get("Partition")), {})
    return account or "", row.get("Def QOS", ""), row


def _default_account(user: str, ask: Ask, unanswered_fix: str) -> str:
    done = ask(["sacctmgr", "-P", "show", "user", user, "format=User,DefaultAccount"])
    if done is None or getattr(done, "returncode", 1) != 0:
        raise Unknown(slurmctl.unanswered("sacctmgr show user", done), unanswered_fix)
    rows = slurmctl.table(getattr(done, "stdout", "") or "")
    return rows[0].get("Def Acct", "") if rows else ""


def _limit(row: Optional[dict], key: str, command: str, unread_fix: str) -> Optional[int]:
    """The limit ``key`` of a row (None: none set); Unknown when it cannot be read."""
    text = (row or {}).get(key, "")
    if not text:
        return None
    value = slurmctl.number(text)
    if value is None:
        raise Unknown(slurmctl.unreadable(command, key, text), unread_fix)
    return value


def _qos_limits(name: str, qos_row: Callable[[str], tuple[Optional[dict], Optional[str]]], user: str, account: str,
                queued: list[Job], unanswered_fix: str, unread_fix: str) -> list[Limit]:
    """MaxSubmitJobsPerUser, MaxSubmitJobsPerAccount and GrpSubmitJobs of QOS ``name``."""
    row, problem = qos_row(name)
    if problem is not None:
        raise Unknown(f"{name!r} could not be checked: {problem}", unanswered_fix)
    in_qos = [job for job in queued if job.qos == name]
    another = "; or use another QOS (resources.qos)"
    found = []
    for key, label, counted in (
            ("MaxSubmitPU", "MaxSubmitJobsPerUser", sum(job.user == user for job in in_qos)),
            ("MaxSubmitPA", "MaxSubmitJobsPerAccount", sum(job.account == account for job in in_qos)),
            ("GrpSubmit", "GrpSubmitJobs", len(in_qos))):
        value = _limit(row, key, "sacctmgr show qos", unread_fix)
        if value is not None:
            found.append(Limit(f"{label} of QOS {name}", value, counted, another))
    return found
