"""Defines the VM testbed's domains (scripts/vm-start) and writes machines.json.

Environment: VM_PREFIX (domain name prefix), VM_BASE (run directory), VM_N (count), VM_DISK_MIB,
VM_NODES (count of node-sized domains, default 0), VM_NODE_DISK_MIB, VM_NODE_MEMORY_MIB.
Each domain: type qemu (TCG), machine pc (IDE CD-ROM and floppy controller for the emulator's
virtual media), user-mode networking only, serial console to a file, and two raw disks: an
emulated NVMe drive (through <qemu:commandline>: this libvirt has no nvme disk bus) and a SATA
disk (AHCI). The NVMe file is opened by QEMU directly (no libvirt relabelling), so it is made writable for
the QEMU user.

Node-sized domains (named <prefix>-node-<i>) run a real node OS: VM_NODE_MEMORY_MIB of memory, a
SATA boot drive of VM_NODE_DISK_MIB (the install target: SeaBIOS here never probes NVMe, so a VM
boots an installed OS from SATA only) beside a small NVMe data drive, and a network of
their own, the one a tenant's machine gets: QEMU user-mode networking with `restrict=on` (the
guest reaches nothing on this host) and two `guestfwd` doors, each to a loopback port of the host
that the test relays (tests/vm/testbed.rs): 10.0.2.100:6443 to its tenant's API server and
10.0.2.100:8080 to paddock's agent endpoint; and one `hostfwd` from a loopback port of the host to
the kubelet's port 10250 (logs, exec). Every port is in machines.json.

Each node-sized domain also gets a second NIC, the tenant network: a UDP link (`-netdev dgram`,
unprivileged) from a loopback port of QEMU's to a loopback port of the test's hub
(tests/vm/tenantnet.rs), which passes frames only between machines paddock has in one cluster.
Its MAC, 52:54:00:70:00:NN (NN = the node's number from 01), is how the node OS knows the link
and its address on it (images/node/rcS). It stands in for the provider's per-tenant network. A guestfwd runs a command
per connection (`busybox nc`), which libvirt's default QEMU sandbox (`-sandbox ...,spawn=deny`)
forbids, so these domains drop the sandbox capability (`<qemu:capabilities>`; libvirt marks them
tainted); QEMU still runs unprivileged as libvirt's QEMU user.
"""

import json
import os
import socket
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


NODE_NET = """  <qemu:commandline>
    <qemu:arg value='-netdev'/>
    <qemu:arg value={netdev}/>
    <qemu:arg value='-device'/>
    <qemu:arg value='virtio-net-pci,netdev=pn0,addr=0x11'/>
    <qemu:arg value='-netdev'/>
    <qemu:arg value={tenant_netdev}/>
    <qemu:arg value='-device'/>
    <qemu:arg value={tenant_device}/>
    <qemu:arg value='-drive'/>
    <qemu:arg value={nvme_drive}/>
    <qemu:arg value='-device'/>
    <qemu:arg value={nvme_device}/>
  </qemu:commandline>
  <qemu:capabilities>
    <qemu:del capability='seccomp-sandbox'/>
  </qemu:capabilities>
</domain>
"""

# The guest-side address of the node network's doors (guestfwd).
NODE_DOOR = "10.0.2.100"


def free_port(kind=socket.SOCK_STREAM):
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tenant_mac(number):
    """The tenant network NIC's MAC of node `number` (1..99): QEMU's prefix, then 70:00:NN."""
    return "52:54:00:70:00:%02d" % number


def node_xml(xml, ports, number, nvme_drive, nvme_device):
    """A node-sized domain: the small one's XML with more memory, the node network instead of the
    user-mode interface, and the tenant network's link to the hub."""
    nc = "/bin/busybox nc 127.0.0.1 %d"
    netdev = ",".join([
        "user,id=pn0,restrict=on",
        "guestfwd=tcp:%s:6443-cmd:%s" % (NODE_DOOR, nc % ports["api"]),
        "guestfwd=tcp:%s:8080-cmd:%s" % (NODE_DOOR, nc % ports["agent"]),
        "hostfwd=tcp:127.0.0.1:%d-:10250" % ports["kubelet"],
    ])
    head = xml[: xml.index("  <qemu:commandline>")]
    head = head.replace("<memory unit='MiB'>448</memory>", "<memory unit='MiB'>%d</memory>" % int(os.environ.get("VM_NODE_MEMORY_MIB", "3072")))
    head = head.replace("    <interface type='user'><model type='virtio'/></interface>\n", "")
    tenant_netdev = "dgram,id=tn0,local.type=inet,local.host=127.0.0.1,local.port=%d,remote.type=inet,remote.host=127.0.0.1,remote.port=%d" % (
        ports["tenant_net_qemu"], ports["tenant_net"])
    tenant_device = "virtio-net-pci,netdev=tn0,mac=%s,addr=0x12" % tenant_mac(number)
    return head + NODE_NET.format(netdev=quoteattr(netdev), tenant_netdev=quoteattr(tenant_netdev),
                                  tenant_device=quoteattr(tenant_device), nvme_drive=nvme_drive, nvme_device=nvme_device)


def disk(path, size):
    with open(path, "wb") as f:
        f.truncate(size)
    os.chmod(path, 0o666)


def define(conn, prefix, base, name, index, sizes, ports, number=0):
    """Defines one domain; its machines.json entry. `ports` makes it node-sized (node `number`)."""
    nvme = os.path.join(base, "disks", "%s-nvme.raw" % index)
    sata = os.path.join(base, "disks", "%s-sata.raw" % index)
    disk(nvme, sizes[0])
    disk(sata, sizes[1])
    console = os.path.join(base, "%s.console.log" % name)
    tag = prefix.rsplit("-", 1)[-1].upper()
    nvme_serial, sata_serial = "PVN%s%s" % (tag, index), "PVS%s%s" % (tag, index)
    nvme_drive = quoteattr("file=%s,if=none,id=nvm0,format=raw,cache=none,aio=native" % nvme.replace(",", ",,"))
    nvme_device = quoteattr("nvme,serial=%s,drive=nvm0,bus=pci.0,addr=0x10" % nvme_serial)
    xml = DOMAIN.format(
        name=name,
        sata_path=quoteattr(sata),
        sata_serial=sata_serial,
        console=quoteattr(console),
        nvme_drive=nvme_drive,
        nvme_device=nvme_device,
    )
    if ports:
        xml = node_xml(xml, ports, number, nvme_drive, nvme_device)
    dom = conn.defineXML(xml)
    # The definition as defined, for the tests to put a domain back as it was.
    definition = os.path.join(base, "%s.xml" % name)
    with open(definition, "w") as f:
        f.write(dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE))
    machine = {
        "name": name,
        "uuid": dom.UUIDString(),
        "console": console,
        "definition": definition,
        "disks": [
            {"name": "nvme0", "path": nvme, "bus": "nvme", "serial": nvme_serial, "size_bytes": sizes[0]},
            {"name": "sda", "path": sata, "bus": "sata", "serial": sata_serial, "size_bytes": sizes[1]},
        ],
    }
    if ports:
        machine["node"] = {"door": NODE_DOOR, "ports": ports, "tenant_mac": tenant_mac(number)}
    return machine


def main():
    env = os.environ
    prefix, base = env["VM_PREFIX"], env["VM_BASE"]
    size = int(env["VM_DISK_MIB"]) * 1024 * 1024
    node_size = int(env.get("VM_NODE_DISK_MIB", "4096")) * 1024 * 1024
    conn = libvirt.open("qemu:///system")
    machines = []
    for i in range(int(env["VM_N"])):
        machines.append(define(conn, prefix, base, "%s-%d" % (prefix, i), str(i), (size, size), None))
    for i in range(int(env.get("VM_NODES", "0"))):
        ports = {"api": free_port(), "agent": free_port(), "kubelet": free_port(),
                 "tenant_net": free_port(socket.SOCK_DGRAM), "tenant_net_qemu": free_port(socket.SOCK_DGRAM)}
        name = "%s-node-%d" % (prefix, i)
        machines.append(define(conn, prefix, base, name, "n%d" % i, (size, node_size), ports, i + 1))
    with open(os.path.join(base, "machines.json"), "w") as f:
        json.dump({"prefix": prefix, "machines": machines}, f, indent=2)
        f.write("\n")


if __name__ == "__main__":
    sys.exit(main())
