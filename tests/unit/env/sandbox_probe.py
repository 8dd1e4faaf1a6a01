# A worker stand-in for the sandbox tests: reports what the sandbox gave it, then obeys.
import json
import os
import resource
import signal
import subprocess
import sys
import time

import zmq

args = dict(zip(sys.argv[1::2], sys.argv[2::2]))
ctx = zmq.Context()
sock = ctx.socket(zmq.PAIR)
sock.setsockopt(zmq.LINGER, 2000)
sock.connect(args["--endpoint"])
with open("/proc/net/dev") as f:
    interfaces = [line.split(":")[0].strip() for line in f.readlines()[2:]]
report = {
    "type": "ready",
    "hardware": "probe",
    "cwd": os.getcwd(),
    "env": dict(os.environ),
    "interfaces": interfaces,
    "rlimit_core": resource.getrlimit(resource.RLIMIT_CORE)[0],
    "rlimit_as": resource.getrlimit(resource.RLIMIT_AS)[0],
    "rlimit_fsize": resource.getrlimit(resource.RLIMIT_FSIZE)[0],
    "rlimit_as_unlimited": resource.getrlimit(resource.RLIMIT_AS)[0] == resource.RLIM_INFINITY,
    "pid": os.getpid(),
    "pgid": os.getpgid(0),
    "sid": os.getsid(0),
    "device": args["--device"],
}
sock.send_string(json.dumps(report))
while True:
    cmd = json.loads(sock.recv_string())
    what = cmd["type"]
    if what == "exit":
        sock.send_string(json.dumps({"type": "bye"}))
        sock.close()
        ctx.term()
        os._exit(cmd["code"])
    elif what == "segv":
        os.kill(os.getpid(), signal.SIGSEGV)
    elif what == "spawn":
        child = subprocess.Popen(["sleep", "1000"])
        sock.send_string(json.dumps({"type": "spawned", "pid": child.pid}))
    elif what == "hang":
        time.sleep(1000)
    elif what == "frames":
        sock.send_multipart([json.dumps({"type": "frames"}).encode(), b"\x01\x02\x03", b""])
