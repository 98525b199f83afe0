"""Defines the VM testbed's domains (scripts/vm-start) and writes machines.json.

Environment: VM_PREFIX (domain name prefix), VM_BASE (run directory), VM_N (count), VM_DISK_MIB.
Each domain: type qemu (TCG), machine pc (IDE CD-ROM and floppy controller for the emulator's
virtual media), user-mode networking only, serial console to a file, and two raw disks: an
emulated NVMe drive (through <qemu:commandline>: this libvirt has no nvme disk bus) and a SATA
disk (AHCI). The NVMe file is opened by QEMU directly (no libvirt relabelling), so it is made writable for
the QEMU user.
"""

import json
import os
import sys
from xml.sax.saxutils import quoteattr

import libvirt

DOMAIN = """<domain type='qemu' xmlns:qemu='http://libvirt.org/schemas/domain/qemu/1.0'>
  <name>{name}</name>
  <memory unit='MiB'>448</memory>
  <vcpu>1</vcpu>
  <os><type arch='x86_64' machine='pc'>hvm</type><boot dev='hd'/></os>
  <features><acpi/></features>
  <on_poweroff>destroy</on_poweroff>
  <on_reboot>restart</on_reboot>
  <on_crash>destroy</on_crash>
  <devices>
    <disk type='file' device='disk'>
      <driver name='qemu' type='raw' cache='none' io='native'/>
      <source file={sata_path}/>
      <target dev='sda' bus='sata'/>
      <serial>{sata_serial}</serial>
    </disk>
    <interface type='user'><model type='virtio'/></interface>
    <serial type='file'><source path={console}/><target port='0'/></serial>
    <console type='file'><source path={console}/><target type='serial' port='0'/></console>
    <video><model type='none'/></video>
    <memballoon model='none'/>
  </devices>
  <qemu:commandline>
    <qemu:arg value='-drive'/>
    <qemu:arg value={nvme_drive}/>
    <qemu:arg value='-device'/>
    <qemu:arg value={nvme_device}/>
  </qemu:commandline>
</domain>
"""


def disk(path, size):
    with open(path, "wb") as f:
        f.truncate(size)
    os.chmod(path, 0o666)


def main():
    env = os.environ
    prefix, base = env["VM_PREFIX"], env["VM_BASE"]
    size = int(env["VM_DISK_MIB"]) * 1024 * 1024
    conn = libvirt.open("qemu:///system")
    machines = []
    for i in range(int(env["VM_N"])):
        name = "%s-%d" % (prefix, i)
        nvme = os.path.join(base, "disks", "%d-nvme.raw" % i)
        sata = os.path.join(base, "disks", "%d-sata.raw" % i)
        disk(nvme, size)
        disk(sata, size)
        console = os.path.join(base, "%s.console.log" % name)
        tag = prefix.rsplit("-", 1)[-1].upper()
        nvme_serial, sata_serial = "PVN%s%d" % (tag, i), "PVS%s%d" % (tag, i)
        xml = DOMAIN.format(
            name=name,
            sata_path=quoteattr(sata),
            sata_serial=sata_serial,
            console=quoteattr(console),
            nvme_drive=quoteattr("file=%s,if=none,id=nvm0,format=raw,cache=none,aio=native" % nvme.replace(",", ",,")),
            nvme_device=quoteattr("nvme,serial=%s,drive=nvm0,bus=pci.0,addr=0x10" % nvme_serial),
        )
        dom = conn.defineXML(xml)
        # The definition as defined, for the tests to put a domain back as it was.
        definition = os.path.join(base, "%s.xml" % name)
        with open(definition, "w") as f:
            f.write(dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE))
        machines.append({
            "name": name,
            "uuid": dom.UUIDString(),
            "console": console,
            "definition": definition,
            "disks": [
                {"name": "nvme0", "path": nvme, "bus": "nvme", "serial": nvme_serial, "size_bytes": size},
                {"name": "sda", "path": sata, "bus": "sata", "serial": sata_serial, "size_bytes": size},
            ],
        })
    with open(os.path.join(base, "machines.json"), "w") as f:
        json.dump({"prefix": prefix, "machines": machines}, f, indent=2)
        f.write("\n")


if __name__ == "__main__":
    sys.exit(main())
