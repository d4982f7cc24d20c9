"""The machine a fine-tune plans for: CPU cores, the memory available now, an accelerator.
Read from Linux's /proc and /dev without importing TensorFlow."""
import glob
import os

from efficientdet_hpu.benchmarks import report
from efficientdet_hpu.finetune import plan

GIB = 2.0 ** 30


def memory_available_gb(meminfo='/proc/meminfo') -> float:
    """MemAvailable (what can be allocated without swapping, page cache included), else
    os.sysconf's free pages."""
    try:
        with open(meminfo) as stream:
            for line in stream:
                if line.startswith('MemAvailable:'):
                    return int(line.split()[1]) * 1024 / GIB
    except OSError:
        pass
    return os.sysconf('SC_AVPHYS_PAGES') * os.sysconf('SC_PAGE_SIZE') / GIB


def cpu_cores() -> int:
    """Cores this process may run on (a container's or taskset's limit, not the host's)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def accelerator() -> str:
    """'HPU' (Habana's /dev/accel or /dev/hl devices), 'GPU' (an NVIDIA driver's GPU), or ''."""
    if glob.glob('/dev/accel/accel[0-9]*') or glob.glob('/dev/hl[0-9]*'):
        return 'HPU'
    if glob.glob('/proc/driver/nvidia/gpus/*'):
        return 'GPU'
    return ''


def detect() -> plan.Hardware:
    return plan.Hardware(cpu_cores(), memory_available_gb(), accelerator(),
                         report.cpu_description())


def line(hardware) -> str:
    """'2 CPU cores, 21.3 GB memory available, no GPU or HPU'."""
    return '%d CPU cores, %.1f GB memory available, %s' % (
        hardware.cores, hardware.memory_gb, hardware.accelerator or 'no GPU or HPU')
