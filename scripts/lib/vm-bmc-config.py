"""Writes a sushy-tools configuration for the VM testbed (scripts/vm-start), on stdout.

Environment: VM_BASE (run directory, with machines.json and htpasswd), VM_PORT, VM_CERTS (directory
with server.pem/server.key for HTTPS, or empty), VM_POOL (storage pool), VM_URI (libvirt URI).
Only this run's domains are served; each one's disks are listed as Redfish drives, as a real BMC
reports them (the libvirt driver has no drive inventory of its own).
"""

import json
import os

env = os.environ
base = env["VM_BASE"]
with open(os.path.join(base, "machines.json")) as f:
    machines = json.load(f)["machines"]

storage, drives = {}, {}
for m in machines:
    ids = [d["name"] for d in m["disks"]]
    storage[m["uuid"]] = [{"Id": "1", "Name": "Local Storage Controller",
                           "StorageControllers": [{"MemberId": "0", "Name": "Controller", "SpeedGbps": 8}],
                           "Drives": ids}]
    drives[(m["uuid"], "1")] = [{"Id": d["name"], "Name": d["name"], "SerialNumber": d["serial"],
                                 "Protocol": "NVMe" if d["bus"] == "nvme" else "SATA",
                                 "CapacityBytes": d["size_bytes"]} for d in m["disks"]]

cfg = {
    "SUSHY_EMULATOR_LIBVIRT_URI": env["VM_URI"],
    "SUSHY_EMULATOR_STORAGE_POOL": env["VM_POOL"],
    "SUSHY_EMULATOR_IGNORE_BOOT_DEVICE": False,
    "SUSHY_EMULATOR_ALLOWED_INSTANCES": [m["uuid"] for m in machines],
    "SUSHY_EMULATOR_LISTEN_IP": "127.0.0.1",
    "SUSHY_EMULATOR_LISTEN_PORT": int(env["VM_PORT"]),
    "SUSHY_EMULATOR_STATE_DIR": env["VM_STATE"],
    "SUSHY_EMULATOR_AUTH_FILE": os.path.join(base, "htpasswd"),
    "SUSHY_EMULATOR_VMEDIA_VERIFY_SSL": True,
    "SUSHY_EMULATOR_STORAGE": storage,
    "SUSHY_EMULATOR_DRIVES": drives,
}
if env.get("VM_CERTS"):
    cfg["SUSHY_EMULATOR_SSL_CERT"] = os.path.join(env["VM_CERTS"], "server.pem")
    cfg["SUSHY_EMULATOR_SSL_KEY"] = os.path.join(env["VM_CERTS"], "server.key")
print("# Written by scripts/vm-start.")
for key, value in cfg.items():
    print("%s = %r" % (key, value))
