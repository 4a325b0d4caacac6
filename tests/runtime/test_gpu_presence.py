"""Telling that no GPU can be present without TensorFlow: fake PCI buses and device
folders, each way the answer must turn to "maybe"; and `--print-config` on a machine
without GPUs, which then starts no TensorFlow."""

import subprocess
import sys

import pytest

from helpers.paths import REPO_ROOT
from tfdist.runtime.gpu_presence import gpus_certainly_absent

HOST_BRIDGE = ("0x8086", "0x060000")
VIRTIO_NET = ("0x1af4", "0x020000")


def fake_machine(root, devices, device_files=()):
    """`(pci folder, dev folder)` of a machine with `devices` ((vendor, class) pairs) on
    its bus and `device_files` under /dev."""
    pci, dev = root / "pci", root / "dev"
    pci.mkdir()
    dev.mkdir()
    for number, (vendor, device_class) in enumerate(devices):
        folder = pci / f"0000:00:{number:02x}.0"
        folder.mkdir()
        (folder / "vendor").write_text(vendor + "\n")
        (folder / "class").write_text(device_class + "\n")
    for name in device_files:
        (dev / name).write_text("")
    return str(pci), str(dev)


def absent(root, devices, device_files=(), paths=()):
    pci, dev = fake_machine(root, devices, device_files)
    return gpus_certainly_absent(pci_devices=pci, dev=dev, paths=list(paths))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads a Linux machine's sysfs")
def test_a_bus_without_gpus_is_certain(tmp_path):
    assert absent(tmp_path, [HOST_BRIDGE, VIRTIO_NET]) is True


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads a Linux machine's sysfs")
def test_an_intel_display_is_no_gpu_tensorflow_uses(tmp_path):
    assert absent(tmp_path, [HOST_BRIDGE, ("0x8086", "0x030000")]) is True


@pytest.mark.parametrize("device", [
    ("0x10de", "0x030000"),  # NVIDIA VGA controller
    ("0x10de", "0x030200"),  # NVIDIA 3D controller (data-centre GPUs)
    ("0x1002", "0x038000"),  # AMD display controller
    ("0x1002", "0x120000"),  # AMD processing accelerator (Instinct)
], ids=["nvidia-vga", "nvidia-3d", "amd-display", "amd-accelerator"])
def test_a_gpu_on_the_bus_means_maybe_even_without_its_driver(tmp_path, device):
    assert absent(tmp_path, [HOST_BRIDGE, device]) is False


@pytest.mark.parametrize("name", ["nvidiactl", "nvidia0", "kfd", "dxg"])
def test_a_gpu_drivers_device_file_means_maybe(tmp_path, name):
    assert absent(tmp_path, [HOST_BRIDGE], device_files=[name]) is False


def test_a_tensorflow_device_plugin_means_maybe(tmp_path):
    site = tmp_path / "site-packages"
    (site / "tensorflow-plugins").mkdir(parents=True)
    assert absent(tmp_path, [HOST_BRIDGE], paths=[str(site)]) is False


def test_a_bus_that_cannot_be_read_or_is_hidden_means_maybe(tmp_path):
    assert gpus_certainly_absent(pci_devices=str(tmp_path / "none"), dev=str(tmp_path)) is False
    assert absent(tmp_path, []) is False  # an empty bus: hidden from this process
    unreadable = tmp_path / "other"
    unreadable.mkdir()
    pci, dev = fake_machine(unreadable, [HOST_BRIDGE])
    (tmp_path / "other" / "pci" / "0000:00:00.0" / "class").unlink()
    assert gpus_certainly_absent(pci_devices=pci, dev=dev, paths=[]) is False


@pytest.mark.skipif(not gpus_certainly_absent(), reason="a machine where a GPU may be present")
@pytest.mark.parametrize("recipe", ["transformer", "cnn", "translation"])
def test_print_config_starts_no_tensorflow_on_a_machine_without_gpus(recipe):
    """The preview resolves `auto` from the CPU alone (2-5 s of TensorFlow import saved)."""
    program = ("import runpy, sys\n"
               f"sys.argv = ['{recipe}', '--print-config']\n"
               "try:\n"
               f"    runpy.run_module('tfdist.recipes.{recipe}', run_name='__main__')\n"
               "except SystemExit as stop:\n"
               "    assert stop.code == 0, stop.code\n"
               "print('imported:', sorted(m for m in ('tensorflow', 'keras') if m in sys.modules))\n")
    result = subprocess.run([sys.executable, "-c", program], cwd=REPO_ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120)
    assert result.returncode == 0, result.stdout[-3000:]
    assert "resolved:" in result.stdout and "precision:" in result.stdout, result.stdout[-3000:]
    assert result.stdout.rstrip().endswith("imported: []"), result.stdout[-3000:]
