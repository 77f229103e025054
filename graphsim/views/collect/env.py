"""The identity of a local collection run: which device, which software, which collector.

Every row a local collector writes carries these fields (the measured-table identity columns of
docs/measured.md, and the FPM partition keys of docs/fpm.md), so tables of different machines, JAX
releases, XLA flags or collector revisions are different partitions and are never mixed.
"""
from __future__ import annotations

import datetime
import hashlib
import json
import os
import platform
import sys

#: Bumped whenever what a local timing covers changes (warm-up, synchronisation, what is inside the timed
#: region): samples of different revisions are different partitions.
COLLECTOR_REVISION = "1"
#: What one local timing covers (the seed's measurement boundary): a jitted JAX call from the host,
#: launch and device synchronisation (``block_until_ready``) included, inputs already on the device.
BOUNDARY_NOTE = "jitted call from the host to block_until_ready (launch + sync included), inputs resident"


def _cpuinfo(field: str) -> str:
    """The first ``field`` line of Linux's /proc/cpuinfo ("" elsewhere)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.lower().startswith(field):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo; ``platform.processor()`` elsewhere)."""
    return _cpuinfo("model name") or platform.processor() or platform.machine() or "unknown cpu"


def device_info() -> dict:
    """The default JAX device: platform (cpu / gpu / tpu), its name as the collector reports it (with the
    core count on a CPU), how many devices of that platform the process sees, and the driver where known."""
    import jax

    dev = jax.devices()[0]
    plat = dev.platform
    if plat == "cpu":
        name = f"{cpu_model()} ({os.cpu_count() or 1} cores)"
        driver = f"{platform.system()} {platform.release()}"
    else:
        name = getattr(dev, "device_kind", plat)
        driver = ""
        try:  # jaxlib exposes the runtime's version string on GPU backends
            driver = str(jax.extend.backend.get_backend().platform_version)
        except Exception:  # noqa: BLE001 - best effort: the field stays empty rather than wrong
            driver = ""
    return {"platform": plat, "device_name": name, "devices": jax.device_count(), "driver": driver}


def environment(device: str) -> dict:
    """Identity fields of a local run on ``device`` (the graphsim hardware name, e.g. the probed descriptor's).

    ``image_digest`` hashes the software environment that decides a timing — Python, JAX, jaxlib, NumPy, the
    platform, driver, CPU flags and the XLA flags — standing in for a container digest: any change makes a
    new partition.
    """
    import jax
    import jaxlib
    import numpy as np

    from ...core.version import __version__

    info = device_info()
    env = {"python": sys.version.split()[0], "jax": jax.__version__, "jaxlib": jaxlib.__version__,
           "numpy": np.__version__, "platform": info["platform"], "driver": info["driver"],
           "device_name": info["device_name"], "cpu_flags": _cpuinfo("flags"), "xla_flags": os.environ.get("XLA_FLAGS", ""),
           "threads": os.environ.get("OMP_NUM_THREADS", "")}
    digest = "env:sha256:" + hashlib.sha256(json.dumps(env, sort_keys=True).encode()).hexdigest()[:16]
    version = jax.__version__ if jaxlib.__version__ == jax.__version__ else f"{jax.__version__}-jaxlib{jaxlib.__version__}"
    return {
        "device": device.lower(),
        "device_name": info["device_name"],
        "framework": "jax",
        "version": version,
        "image_digest": digest,
        "kernel_source": f"xla:{info['platform']}",
        "platform": info["platform"],
        "driver": info["driver"],
        "devices": info["devices"],
        "collected": datetime.date.today().isoformat(),
        "instrumentation": f"graphsim {__version__} collector r{COLLECTOR_REVISION}",
    }
