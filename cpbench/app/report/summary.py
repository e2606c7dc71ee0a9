"""The header facts of a set of records: scenarios, devices, hosts, software, environment
variables, time span, and status counts with their reasons grouped."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from cpbench.app.report.data import Summary
from cpbench.results.schema import STATUSES


def _group_reasons(messages: Iterable[str]) -> list[tuple[int, str, int]]:
    """(count, example, variants) per message pattern (numbers ignored), most frequent first."""
    groups: dict[str, list[str]] = {}
    for msg in messages:
        key = re.sub(r"\d+(\.\d+)?(e[-+]?\d+)?", "#", msg or "(no reason recorded)")
        groups.setdefault(key, []).append(msg or "(no reason recorded)")
    out = [(len(v), v[0], len(set(v))) for v in groups.values()]
    return sorted(out, key=lambda t: (-t[0], t[1]))


def _cfg(record: Mapping[str, Any]) -> Mapping[str, Any]:
    cfg = record.get("config")
    return cfg if isinstance(cfg, Mapping) else {}


def summarize(records: Sequence[Mapping[str, Any]]) -> Summary:
    """Header facts: scenarios, devices, hosts, software versions, environment variables,
    record time span and status counts with grouped reasons."""
    statuses = Counter(str(r.get("status")) for r in records)
    devices: Counter[str] = Counter()
    hosts: set[str] = set()
    software: dict[str, set[str]] = {}
    env_vars: dict[str, set[str]] = {}
    for r in records:
        env = r.get("environment")
        if not isinstance(env, Mapping):
            continue
        devs = env.get("devices")
        if isinstance(devs, list):
            for name, count in Counter(map(str, devs)).items():
                devices[name] = max(devices[name], count)
        hostnames = env.get("hostnames")
        if isinstance(hostnames, list):
            hosts.update(map(str, hostnames))
        for key, value in env.items():
            if key in ("devices", "hostnames", "env"):
                continue
            if value is None or isinstance(value, (str, int, float, bool)):
                software.setdefault(str(key), set()).add("none" if value is None else str(value))
        variables = env.get("env")
        if isinstance(variables, Mapping):
            for key, value in variables.items():
                env_vars.setdefault(str(key), set()).add(str(value))
    stamps = sorted(str(r["timestamp"]) for r in records if r.get("timestamp"))
    return Summary(
        scenarios=sorted({str(r.get("scenario")) for r in records if r.get("scenario")}),
        total=len(records),
        statuses=dict(statuses),
        reasons={
            status: _group_reasons(
                str(r.get("error") or "") for r in records if r.get("status") == status
            )
            for status in STATUSES
            if status != "ok"
            if statuses.get(status)
        },
        devices=dict(devices),
        hosts=sorted(hosts),
        software={k: sorted(v) for k, v in sorted(software.items())},
        env={k: sorted(v) for k, v in sorted(env_vars.items())},
        first=stamps[0] if stamps else None,
        last=stamps[-1] if stamps else None,
        device_kinds=sorted({str(_cfg(r).get("device")) for r in records if _cfg(r).get("device")}),
    )
