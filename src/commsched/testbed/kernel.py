"""What this kernel can shape with: each qdisc, the u32 filter and nftables' bridge family, tried once.

Kernels differ in what they were built with (a distribution kernel has
every qdisc as a module; a small VM kernel may lack sch_prio, sch_red or
sch_netem), so the testbed asks the kernel itself: it builds what it needs
once, in a namespace of its own, and remembers the answers for the process.
:func:`unavailable_reason` turns missing features into one sentence naming
the kernel options (and the command to install a missing ``nft``).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable, Mapping

from commsched.testbed.commands import PREFIX
from commsched.testbed.nft import PortRules, switch_ruleset
from commsched.testbed.ports import SwitchShape, red_args
from commsched.testbed.system import TOOL_HINTS, TestbedError, netns_unavailable_reason, run_command

#: feature -> (kernel options, modules)
FEATURES = {
    "htb": ("CONFIG_NET_SCH_HTB", "sch_htb"),
    "u32": ("CONFIG_NET_CLS_U32", "cls_u32"),
    "prio": ("CONFIG_NET_SCH_PRIO", "sch_prio"),
    "red": ("CONFIG_NET_SCH_RED", "sch_red"),
    "netem": ("CONFIG_NET_SCH_NETEM", "sch_netem"),
    "nft": (
        "CONFIG_NF_TABLES_BRIDGE, CONFIG_NFT_LIMIT, CONFIG_NFT_NUMGEN",
        "nf_tables, nft_limit, nft_numgen",
    ),
}
_QDISCS = {
    "htb": ["htb"],
    "prio": ["prio"],
    "red": red_args(SwitchShape(rate_bps=10**7, queue_pkts=2)),
    "netem": ["netem", "delay", "1ms"],
}
# Every nft feature the testbed uses: a bridge table, named counters and limits, numgen, `ip ecn set ce`.
_NFT_PROBE = PortRules("q1", 2, ((46, 0),), 1, loss_pct=1.0, virtual=True, rate_pps=1000, threshold_pkts=4)

_answers: dict[str, bool] = {}
_nft_error: list[str] = []


def _probe() -> None:
    ns = f"{PREFIX}{os.getpid()}-kprobe"
    run_command(["ip", "netns", "add", ns])
    try:
        run_command(["ip", "-n", ns, "link", "add", "q0", "type", "veth", "peer", "name", "q1"])
        tc = ["tc", "-n", ns, "qdisc"]
        for kind, args in _QDISCS.items():
            try:
                run_command([*tc, "add", "dev", "q0", "root", "handle", "1:", *args])
            except TestbedError:
                _answers[kind] = False
                continue
            _answers[kind] = True
            if kind == "htb":
                filt = ["tc", "-n", ns, "filter", "add", "dev", "q0", "parent", "1:", "protocol", "ip", "prio", "1"]
                try:
                    run_command([*filt, "u32", "match", "ip", "dsfield", "0xb8", "0xfc", "flowid", "1:1"])
                    _answers["u32"] = True
                except TestbedError:
                    _answers["u32"] = False
            run_command([*tc, "del", "dev", "q0", "root"], check=False)
        if shutil.which("nft") is not None:
            try:
                run_command(["ip", "netns", "exec", ns, "nft", "-f", "-"], stdin_text=switch_ruleset([_NFT_PROBE]))
                _answers["nft"] = True
            except TestbedError as exc:
                _answers["nft"] = False
                _nft_error.append(str(exc).splitlines()[-1][:300])
    finally:
        run_command(["ip", "netns", "del", ns], check=False)


def has(feature: str) -> bool:
    """Whether this kernel has ``feature`` (a key of :data:`FEATURES`); probes once per process (needs root)."""
    if feature not in FEATURES:
        raise ValueError(f"feature: unknown {feature!r}; known: {', '.join(FEATURES)}")
    if not _answers:
        _probe()
    return _answers.get(feature, False)


def unavailable_reason(features: Iterable[str], what: str, hints: Mapping[str, str] | None = None) -> str | None:
    """Why ``what`` cannot be built here (None when it can): no namespaces, no ``nft``, or kernel features missing.

    ``hints``: per feature, a sentence added when that feature is missing (each once).
    """
    wanted = list(dict.fromkeys(features))
    reason = netns_unavailable_reason()
    if reason is not None:
        return reason
    if "nft" in wanted and shutil.which("nft") is None:
        return f"{what} needs nftables' `nft` command, which is not installed: {TOOL_HINTS['nft']}"
    missing = [f for f in wanted if not has(f)]
    if not missing:
        return None
    configs = ", ".join(f"{FEATURES[f][0]} (module {FEATURES[f][1]})" for f in missing)
    text = f"{what} needs {', '.join(missing)}, which this kernel lacks: {configs}"
    if "nft" in missing and _nft_error:
        text += f" (nft said: {_nft_error[0]})"
    for hint in dict.fromkeys((hints or {}).get(f) for f in missing):
        if hint:
            text += f"; {hint}"
    return text
