"""kvoffload.transfer.numa: binding a range to a NUMA node (``mbind``), reading the policy and the
pages' placement back (``get_mempolicy``, ``move_pages``), the GPU's node from a fake sysfs tree."""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from kvoffload.errors import InvalidArgumentError, InvalidTypeError, NumaError
from kvoffload.transfer import numa
from kvoffload.transfer.numa import bind, bound_node, device_numa_node, numa_nodes, pci_numa_node, place_pool, placement

PAGE = mmap.PAGESIZE
PAGES = 8


def address_of(mm: mmap.mmap) -> int:
    view = (ctypes.c_char * 1).from_buffer(mm)
    try:
        return ctypes.addressof(view)
    finally:
        del view


def _refusal() -> str | None:
    """Why the NUMA system calls cannot be tested here (seccomp, no CONFIG_NUMA), or None."""
    mm = mmap.mmap(-1, PAGE)
    try:
        bound_node(address_of(mm))
        placement(address_of(mm), PAGE)
    except NumaError as exc:
        if exc.errno in (errno.ENOSYS, errno.EPERM):
            return f"NUMA system calls refused here: {errno.errorcode[exc.errno]} ({exc})"
        raise
    finally:
        mm.close()
    return None


REFUSED = _refusal()
needs_syscalls = pytest.mark.skipif(REFUSED is not None, reason=REFUSED or "")
USABLE = [n for n in numa_nodes() if (allowed := numa._mems_allowed()) is None or n in allowed]


@pytest.fixture
def region() -> Iterator[tuple[mmap.mmap, int]]:
    mm = mmap.mmap(-1, PAGES * PAGE)
    yield mm, address_of(mm)
    mm.close()


def touch(mm: mmap.mmap) -> None:
    for p in range(0, len(mm), PAGE):
        mm[p] = 1


@needs_syscalls
@pytest.mark.parametrize("node", USABLE)
def test_bound_pages_land_on_the_node(region: tuple[mmap.mmap, int], node: int) -> None:
    mm, addr = region
    assert bound_node(addr) is None
    bind(addr, len(mm) - 100, node)  # the length is rounded up to whole pages
    assert bound_node(addr) == node and bound_node(addr + (PAGES - 1) * PAGE) == node
    assert placement(addr, len(mm)) == {-errno.ENOENT: PAGES}  # nothing faulted in yet
    touch(mm)
    assert placement(addr, len(mm)) == {node: PAGES}
    bind(addr, len(mm), node)  # again, pages already touched (MPOL_MF_MOVE): still fine
    assert placement(addr, len(mm)) == {node: PAGES}


@needs_syscalls
def test_a_range_bound_nowhere_keeps_the_default_policy_and_is_readable(region: tuple[mmap.mmap, int]) -> None:
    mm, addr = region
    bind(addr, PAGE, USABLE[0])  # only the first page: the rest keeps the default policy
    assert bound_node(addr) == USABLE[0] and bound_node(addr + PAGE) is None
    mm[PAGE] = 1
    got = placement(addr + PAGE + 10, 2 * PAGE)  # rounded out to 3 pages: 1 touched, 2 not
    assert got.pop(-errno.ENOENT) == 2 and sum(got.values()) == 1 and set(got) <= set(USABLE)


@needs_syscalls
def test_shared_mapping_policy_is_the_files(tmp_path: Path) -> None:
    """Bound through one mapping of a tmpfs file, the policy is seen through another (the file's)."""
    shm = Path("/dev/shm") if Path("/dev/shm").is_dir() else tmp_path
    fd = os.open(shm / f"kvoffload_numa_test_{os.getpid()}", os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.unlink(shm / f"kvoffload_numa_test_{os.getpid()}")
        os.ftruncate(fd, PAGES * PAGE)
        a, b = mmap.mmap(fd, PAGES * PAGE), mmap.mmap(fd, PAGES * PAGE)
        bind(address_of(a) + 2 * PAGE, 2 * PAGE, USABLE[-1])
        if shm != tmp_path:  # tmpfs: a shared policy
            assert bound_node(address_of(b) + 2 * PAGE) == USABLE[-1]
            assert bound_node(address_of(b)) is None
        touch(b)
        assert placement(address_of(b) + 2 * PAGE, 2 * PAGE) == {USABLE[-1]: 2}
        # placement reads this mapping's page tables: pages another mapping faulted in are not seen
        assert placement(address_of(a) + 2 * PAGE, 2 * PAGE) == {-errno.ENOENT: 2}
        a.close()
        b.close()
    finally:
        os.close(fd)


@needs_syscalls
@pytest.mark.parametrize(
    ("args", "exc", "match"),
    [
        ({"node": max(numa_nodes() or [0]) + 1}, InvalidArgumentError, "node must be an online NUMA node"),
        ({"node": -1}, InvalidArgumentError, "node must be >= 0"),
        ({"node": True}, InvalidTypeError, "node must be an int"),
        ({"offset": 1}, InvalidArgumentError, "address must be aligned"),
        ({"length": 0}, InvalidArgumentError, "length must be >= 1"),
    ],
)
def test_bad_arguments_change_nothing(
    region: tuple[mmap.mmap, int], args: dict[str, int], exc: type, match: str
) -> None:
    mm, addr = region
    with pytest.raises(exc, match=match):
        bind(addr + args.get("offset", 0), args.get("length", len(mm)), args.get("node", USABLE[0]))
    assert bound_node(addr) is None


@needs_syscalls
def test_unmapped_range_is_a_numa_error_with_its_errno() -> None:
    mm = mmap.mmap(-1, PAGE)
    addr = address_of(mm)
    mm.close()
    with pytest.raises(NumaError, match="mbind.*failed") as info:
        bind(addr, PAGE, USABLE[0])
    assert isinstance(info.value, OSError) and info.value.errno == errno.EFAULT
    with pytest.raises(NumaError) as info:
        bound_node(addr)
    assert info.value.errno == errno.EFAULT
    assert placement(addr, PAGE) == {-errno.EFAULT: 1}


def test_refused_syscall_is_a_numa_error(region: tuple[mmap.mmap, int], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(numa, "_syscall", lambda *a: errno.ENOSYS)
    monkeypatch.setattr(numa, "numa_nodes", lambda sysfs="/sys": [0])
    monkeypatch.setattr(numa, "_mems_allowed", lambda: None)
    mm, addr = region
    with pytest.raises(NumaError, match="Function not implemented"):
        bind(addr, len(mm), 0)
    with pytest.raises(NumaError):
        placement(addr, len(mm))
    with pytest.raises(NumaError):
        place_pool([(addr, len(mm))], "cpu", numa=0)  # an explicit node: raised
    monkeypatch.setattr(numa, "device_numa_node", lambda device: 0)
    assert place_pool([(addr, len(mm))], "cuda:0") is None  # automatic: logged, nothing done


def fake_sysfs(root: Path, devices: dict[str, str], online: str = "0-1,3\n") -> Path:
    for name, text in devices.items():
        (root / "bus/pci/devices" / name).mkdir(parents=True)
        (root / "bus/pci/devices" / name / "numa_node").write_text(text)
    (root / "devices/system/node").mkdir(parents=True)
    (root / "devices/system/node/online").write_text(online)
    return root


def test_pci_numa_node_from_a_fake_sysfs(tmp_path: Path) -> None:
    root = fake_sysfs(tmp_path, {"0000:3b:00.0": "1\n", "0000:5e:00.0": "-1\n", "0001:00:1f.0": "3\n"})
    assert pci_numa_node("0000:3b:00.0", root) == 1
    assert pci_numa_node("0000:3B:00.0", root) == 1  # cudaDeviceGetPCIBusId writes upper case
    assert pci_numa_node("00000000:3B:00.0", root) == 1  # nvidia-smi's 8-digit domain
    assert pci_numa_node("1:0:1f.0", root) == 3
    assert pci_numa_node("0000:5e:00.0", root) is None  # -1: no node known
    assert pci_numa_node("0000:af:00.0", root) is None  # no such device
    with pytest.raises(InvalidArgumentError, match="bus_id"):
        pci_numa_node("3b:00.0", root)
    assert numa_nodes(root) == [0, 1, 3]
    assert numa_nodes(tmp_path / "nowhere") == []


def test_device_numa_node_reads_the_bus_id_from_torch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    root = fake_sysfs(tmp_path, {"0000:3b:00.0": "1\n"})
    assert device_numa_node("cpu", root) is None
    props = SimpleNamespace(pci_domain_id=0, pci_bus_id=0x3B, pci_device_id=0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: props)
    assert device_numa_node("cuda:1", root) == 1
    assert device_numa_node(torch.device("cuda", 0), root) == 1
    # a torch without the pci_*_id properties: cudaDeviceGetPCIBusId of the loaded runtime library
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: SimpleNamespace())

    class Cudart:
        def cudaDeviceGetPCIBusId(self, out: ctypes.Array[ctypes.c_char], size: object, index: object) -> int:
            out.value = b"0000:3B:00.0"
            return 0

    monkeypatch.setattr(numa.ctypes, "CDLL", lambda name, mode=0: Cudart())
    assert device_numa_node("cuda:0", root) == 1

    def not_loaded(name: str, mode: int = 0) -> None:
        raise OSError(f"{name}: not loaded")

    monkeypatch.setattr(numa.ctypes, "CDLL", not_loaded)
    assert device_numa_node("cuda:0", root) is None  # no bus id: no node
    with pytest.raises(InvalidArgumentError, match="device"):
        device_numa_node("tpu:0", root)


@needs_syscalls
def test_place_pool(region: tuple[mmap.mmap, int], monkeypatch: pytest.MonkeyPatch) -> None:
    mm, addr = region
    assert place_pool([(addr, len(mm))], "cpu", numa=False) is None
    with pytest.raises(InvalidArgumentError, match="address must be aligned"):
        place_pool([(addr + 8, len(mm))], "cpu", numa=False)
    assert place_pool([(addr, len(mm))], "cpu") is None  # no node known: nothing done
    assert bound_node(addr) is None
    with pytest.raises(InvalidArgumentError, match="numa=True"):
        place_pool([(addr, len(mm))], "cpu", numa=True)
    with pytest.raises(InvalidTypeError, match="numa must be an int"):
        place_pool([(addr, len(mm))], "cpu", numa="0")  # type: ignore[arg-type]
    monkeypatch.setattr(numa, "device_numa_node", lambda device: 999)
    assert place_pool([(addr, len(mm))], "cuda:0") is None  # a node not usable here: skipped
    with pytest.raises(InvalidArgumentError, match="node"):
        place_pool([(addr, len(mm))], "cuda:0", numa=True)
    assert bound_node(addr) is None
    monkeypatch.setattr(numa, "device_numa_node", lambda device: USABLE[-1])
    assert place_pool([(addr, len(mm))], "cuda:0") == USABLE[-1] == bound_node(addr)
    assert place_pool([(addr, len(mm))], "cuda:0", numa=USABLE[0]) == USABLE[0] == bound_node(addr)
    touch(mm)
    assert placement(addr, len(mm)) == {USABLE[0]: PAGES}


def test_import_initialises_no_cuda() -> None:
    code = "import kvoffload.transfer.numa, torch; assert not torch.cuda.is_initialized()"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
