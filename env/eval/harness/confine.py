"""env/eval/harness/confine.py: the sandbox a worker and its zygote enter before any candidate code runs.

A module of the harness package (worker.py loads it before any candidate code), also run as a
script (the isolation probe: `python -I -B confine.py`); uses only the standard library and the C
library through ctypes, plus libseccomp where it is installed. docs/evaluator.md ("Isolation")
says what each layer stops and what it costs; this file says how.

A worker is confined in this order, every step before any candidate code exists:
  1. namespaces: a user namespace where the process is not root (so that it may make the
     others), then mount, network, IPC and PID namespaces. The PID namespace holds the child of
     a fork: the calling process stays outside as the *keeper*, which only waits for that child
     and exits as it did; the child is PID 1 of a namespace where nothing else exists, and when
     it ends the kernel kills everything it left behind.
  2. the file system: every mount read-only; a private, size-limited tmpfs on /tmp that holds
     the scratch directory (the only place a worker writes: its files never reach the disk), a
     private /dev/shm, an empty /run, a /proc of the new PID namespace. The evaluator's socket
     is bound into the scratch directory.
  3. identity: run as root, the worker becomes `nobody` (no capabilities, no groups); run as a
     user, it keeps that uid and drops every capability of its user namespace.
  4. no_new_privs, then Landlock: reads only of the system's directories, the interpreter's,
     the harness's and the compilers'; writes only beneath /tmp (the scratch), /dev/shm, and
     to device files and /proc's files; no TCP; and, from Landlock ABI 6 on, no signals and no
     abstract Unix sockets outside the worker's own domain. Landlock also refuses ptrace and
     /proc/PID/mem to any process outside the domain.
  5. seccomp (libseccomp): ptrace, process_vm_readv/writev, mounts, new namespaces, keyrings,
     BPF, io_uring and module loading fail with EPERM.
The zygote (which never runs candidate code) enters only steps 1 (no PID namespace), part of
2 (everything read-only) and no_new_privs, so that its children can still make their own.
"""
import ctypes
import ctypes.util
import errno
import os
import pwd
import resource
import select
import signal
import stat
import sys

CLONE_NEWNS = 0x00020000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000

MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_NOATIME = 1024
MS_NODIRATIME = 2048
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
MS_RELATIME = 1 << 21
MS_STRICTATIME = 1 << 24

PR_SET_PDEATHSIG = 1
PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4

# Landlock (include/uapi/linux/landlock.h); the system-call numbers are the same on every
# architecture that has them.
_SYS_LANDLOCK_CREATE_RULESET = 444
_SYS_LANDLOCK_ADD_RULE = 445
_SYS_LANDLOCK_RESTRICT_SELF = 446
LL_EXECUTE = 1 << 0
LL_WRITE_FILE = 1 << 1
LL_READ_FILE = 1 << 2
LL_READ_DIR = 1 << 3
LL_REMOVE_DIR = 1 << 4
LL_REMOVE_FILE = 1 << 5
LL_MAKE_CHAR = 1 << 6
LL_MAKE_DIR = 1 << 7
LL_MAKE_REG = 1 << 8
LL_MAKE_SOCK = 1 << 9
LL_MAKE_FIFO = 1 << 10
LL_MAKE_BLOCK = 1 << 11
LL_MAKE_SYM = 1 << 12
LL_REFER = 1 << 13      # ABI 2
LL_TRUNCATE = 1 << 14   # ABI 3
LL_NET_BIND_TCP = 1     # ABI 4
LL_NET_CONNECT_TCP = 2  # ABI 4
LL_SCOPE_ABSTRACT_UNIX = 1  # ABI 6
LL_SCOPE_SIGNAL = 2         # ABI 6
_LL_FILE_ONLY = LL_EXECUTE | LL_WRITE_FILE | LL_READ_FILE | LL_TRUNCATE

# Every layer a worker can be given, in the order `crucible info` lists them.
WORKER_LAYERS = ("user-namespace", "mount-namespace", "pid-namespace", "network-namespace", "ipc-namespace",
                 "read-only-filesystem", "private-scratch", "unprivileged", "no-new-privs", "landlock",
                 "landlock-scopes", "seccomp")
ZYGOTE_LAYERS = ("mount-namespace", "network-namespace", "ipc-namespace", "read-only-filesystem", "no-new-privs")

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = (ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p)
_libc.syscall.restype = ctypes.c_long


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


class Report:
    """What was put in force, what could not be and why (`missing`: layer -> reason)."""

    def __init__(self, wanted):
        self.wanted = tuple(wanted)
        self.layers = []
        self.missing = {}
        self.landlock_abi = 0

    def ok(self, layer):
        if layer not in self.layers:
            self.layers.append(layer)

    def miss(self, layer, why):
        self.missing.setdefault(layer, why)

    def as_dict(self):
        missing = {k: v for k, v in self.missing.items() if k not in self.layers}
        for layer in self.wanted:
            if layer not in self.layers and layer not in missing:
                missing[layer] = "not set up"
        return {"layers": [x for x in self.wanted if x in self.layers], "missing": missing,
                "landlock_abi": self.landlock_abi}


def _err(what):
    e = ctypes.get_errno()
    return f"{what}: {os.strerror(e)} (errno {e})"


def _write_proc(path, text):
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _mount(source, target, fstype, flags, data=None):
    enc = lambda s: None if s is None else os.fsencode(s)  # noqa: E731
    if _libc.mount(enc(source), enc(target), enc(fstype), flags, enc(data)) != 0:
        raise OSError(ctypes.get_errno(), _err(f"mount {target}"))


def _unshare(flags):
    return _libc.unshare(flags) == 0


def _user_namespace(report):
    """Where we are not root: a user namespace that maps our uid and gid onto themselves, in
    which the other namespaces can be made. Returns False when none could be made."""
    uid, gid = os.geteuid(), os.getegid()
    if not _unshare(CLONE_NEWUSER):
        report.miss("user-namespace", _err("unshare(CLONE_NEWUSER)"))
        return False
    try:
        _write_proc("/proc/self/setgroups", "deny")
        _write_proc("/proc/self/uid_map", f"{uid} {uid} 1")
        _write_proc("/proc/self/gid_map", f"{gid} {gid} 1")
    except OSError as e:
        report.miss("user-namespace", f"cannot map the user namespace's ids: {e.strerror}")
        return False
    report.ok("user-namespace")
    return True


def _namespaces(report, pid):
    """Mount, network, IPC and (pid=True) PID namespaces, each on its own so one the kernel
    refuses does not cost the others. The PID namespace is for the children made after it."""
    if os.geteuid() != 0:
        _user_namespace(report)
    for layer, flag in (("mount-namespace", CLONE_NEWNS), ("network-namespace", CLONE_NEWNET),
                        ("ipc-namespace", CLONE_NEWIPC)) + ((("pid-namespace", CLONE_NEWPID),) if pid else ()):
        if _unshare(flag):
            report.ok(layer)
        else:
            report.miss(layer, _err(f"unshare({layer})"))


def _unescape(field):
    """A path as /proc/self/mountinfo writes it (\\040 for a space, ...)."""
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and i + 3 < len(field) and field[i + 1:i + 4].isdigit():
            out.append(chr(int(field[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


_KEEP_FLAGS = {"nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC, "noatime": MS_NOATIME,
               "nodiratime": MS_NODIRATIME, "relatime": MS_RELATIME, "strictatime": MS_STRICTATIME}


def _mounts():
    """(mount point, flags to keep) for every mount this namespace sees, outermost first."""
    out = []
    with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as f:
        for line in f:
            fields = line.split()
            if len(fields) < 6:
                continue
            flags = 0
            for opt in fields[5].split(","):
                flags |= _KEEP_FLAGS.get(opt, 0)
            out.append((_unescape(fields[4]), flags))
    return out


def _under(path, top):
    return path == top or path.startswith(top.rstrip("/") + "/")


def _read_only(report, skip=()):
    """Every mount remounted read-only (the flags a user namespace locks kept as they are),
    but /proc's, which the new /proc replaces, and those under `skip`."""
    failed = []
    for point, flags in _mounts():
        if _under(point, "/proc") or any(_under(point, s) for s in skip):
            continue
        try:
            _mount(None, point, None, MS_REMOUNT | MS_BIND | MS_RDONLY | flags)
        except OSError as e:
            if e.errno in (errno.ENOENT, errno.EACCES) and point != "/":
                continue  # beneath another mount, or not ours to see: nothing reaches it
            failed.append(f"{point}: {os.strerror(e.errno)}")
    if failed:
        report.miss("read-only-filesystem", "cannot remount read-only: " + "; ".join(failed[:5]))
    else:
        report.ok("read-only-filesystem")


def _outermost(paths):
    return [p for p in paths if not any(q != p and _under(p, q) for q in paths)]


def _bind_back(fds):
    """Binds each (path, O_PATH descriptor opened before a tmpfs hid it) back at its path,
    read-only, making the mount point in the tmpfs."""
    for p, fd in fds:
        if os.path.isdir(f"/proc/self/fd/{fd}"):
            os.makedirs(p, mode=0o755, exist_ok=True)
        else:
            os.makedirs(os.path.dirname(p), mode=0o755, exist_ok=True)
            os.close(os.open(p, os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o644))
        _mount(f"/proc/self/fd/{fd}", p, None, MS_BIND | MS_REC)
        _mount(None, p, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)


def _private_scratch(report, scratch, socket_path, scratch_mb, readable):
    """A size-limited tmpfs on /tmp (and on the scratch directory's parent, where that is not
    under /tmp) with the scratch directory in it, the evaluator's socket bound in, and the
    readable paths that lay beneath (an extension cache under /tmp, say) bound back read-only;
    private /dev/shm and an empty /run."""
    sock_fd = os.open(socket_path, os.O_PATH | os.O_CLOEXEC) if socket_path else -1
    parent = os.path.dirname(scratch.rstrip("/"))
    hidden = _outermost([p for p in readable if _under(p, "/tmp") or _under(p, parent)])
    keep = []
    try:
        for p in hidden:
            keep.append((p, os.open(p, os.O_PATH | os.O_CLOEXEC)))
        size = f"size={int(scratch_mb)}m,nr_inodes=65536,mode=1777"
        _mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, size)
        if not _under(parent, "/tmp"):
            _mount("tmpfs", parent, "tmpfs", MS_NOSUID | MS_NODEV, size)
        os.makedirs(scratch, mode=0o700, exist_ok=True)
        _bind_back(keep)
        if sock_fd >= 0:
            target = os.path.join(scratch, os.path.basename(socket_path))
            os.close(os.open(target, os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o600))
            _mount(f"/proc/self/fd/{sock_fd}", target, None, MS_BIND)
        for point in ("/dev/shm", "/run"):
            if os.path.isdir(point) and not os.path.islink(point):
                _mount("tmpfs", point, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC,
                       "size=64m,mode=1777" if point == "/dev/shm" else "size=1m,mode=755")
        report.ok("private-scratch")
    except OSError as e:
        report.miss("private-scratch", e.strerror or str(e))
    finally:
        if sock_fd >= 0:
            os.close(sock_fd)
        for _, fd in keep:
            os.close(fd)


def _within_reach(readable):
    """Run as root, a worker becomes nobody, who cannot pass a directory like /root (mode 700)
    on the way to an interpreter installed beneath it. Each such directory gets an empty tmpfs
    (which also hides the rest of it), and the readable paths beneath it are bound back in,
    read-only, at the same place."""
    tops = {}
    for p in readable:
        a = ""
        for part in p.strip("/").split("/")[:-1]:
            a += "/" + part
            try:
                if not os.stat(a).st_mode & 0o001:
                    tops.setdefault(a, []).append(p)
                    break
            except OSError:
                break
    for top, paths in tops.items():
        fds = [(p, os.open(p, os.O_PATH | os.O_CLOEXEC)) for p in _outermost(paths)]
        try:
            _mount("tmpfs", top, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=755")
            _bind_back(fds)
            _mount(None, top, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
        finally:
            for _, fd in fds:
                os.close(fd)


def _new_proc(report):
    try:
        _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    except OSError as e:
        report.miss("pid-namespace", f"cannot mount the PID namespace's /proc: {e.strerror}")
        report.layers = [x for x in report.layers if x != "pid-namespace"]


def _nobody():
    try:
        p = pwd.getpwnam("nobody")
        return p.pw_uid, p.pw_gid
    except KeyError:
        return 65534, 65534


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def _drop_bounding_set():
    """The bounding and ambient sets emptied: no capability can come back, by exec or otherwise."""
    for cap in range(64):
        if _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 and ctypes.get_errno() == errno.EINVAL:
            break  # past the last capability this kernel knows
    _libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)


def _drop_capabilities():
    """Bounding and ambient sets, then effective, permitted and inheritable: all empty."""
    _drop_bounding_set()
    hdr = _CapHeader(0x20080522, 0)
    data = (_CapData * 2)()
    if _libc.capset(ctypes.byref(hdr), data) != 0:
        raise OSError(ctypes.get_errno(), _err("capset"))


def _identity(report, owned):
    """As root: become nobody (chowning `owned`, the scratch directory, first). As a user: keep
    the uid, drop the user namespace's capabilities."""
    try:
        if os.geteuid() == 0:
            uid, gid = _nobody()
            for path in owned:
                os.chown(path, uid, gid)
            _drop_bounding_set()  # while we may still change it
            os.setgroups([])
            os.setresgid(gid, gid, gid)
            os.setresuid(uid, uid, uid)  # clears the remaining capability sets
        else:
            _drop_capabilities()
        report.ok("unprivileged")
    except OSError as e:
        report.miss("unprivileged", e.strerror or str(e))


def _no_new_privs(report):
    if _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0:
        report.ok("no-new-privs")
    else:
        report.miss("no-new-privs", _err("prctl(PR_SET_NO_NEW_PRIVS)"))


def landlock_abi():
    """The kernel's Landlock ABI version; 0 where it has none (or it is disabled)."""
    r = _libc.syscall(_SYS_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(1))
    return int(r) if r > 0 else 0


def readable_paths(harness_dir):
    """Where a worker may read: the system's directories, the interpreter's (prefixes and every
    entry of sys.path, by their real paths), the harness's, CUDA's, the compilers', the
    evaluator's extension cache (CRUCIBLE_EXTENSIONS, which only the evaluator writes) and its
    CUDA MPS daemon's pipe directory (CUDA_MPS_PIPE_DIRECTORY: a client connects to its sockets,
    which a read-only bind allows)."""
    paths = ["/usr", "/etc", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/opt", "/sys", harness_dir]
    for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix, os.path.dirname(sys.executable),
              *sys.path):
        if p:
            paths.append(p)
    for var in ("CUDA_HOME", "CUDA_PATH", "CRUCIBLE_EXTENSIONS", "CUDA_MPS_PIPE_DIRECTORY"):
        if os.environ.get(var):
            paths.append(os.environ[var])
    for p in os.environ.get("LD_LIBRARY_PATH", "").split(":"):
        if p:
            paths.append(p)
    for var in ("CC", "CXX"):
        if os.environ.get(var):
            paths.append(os.path.dirname(os.environ[var]))
    out = []
    for p in paths:
        if not os.path.isabs(p):
            continue
        for q in (p, os.path.realpath(p)):
            if os.path.exists(q) and q not in out:
                out.append(q)
    return out


def _landlock(report, readable, writable, files_writable, listable=()):
    abi = landlock_abi()
    report.landlock_abi = abi
    if abi <= 0:
        report.miss("landlock", "the kernel has no Landlock (or it is not enabled: lsm= on the boot line)")
        return
    read = LL_READ_FILE | LL_READ_DIR
    write = (LL_WRITE_FILE | LL_REMOVE_DIR | LL_REMOVE_FILE | LL_MAKE_CHAR | LL_MAKE_DIR | LL_MAKE_REG | LL_MAKE_SOCK
             | LL_MAKE_FIFO | LL_MAKE_BLOCK | LL_MAKE_SYM)
    if abi >= 2:
        write |= LL_REFER
    if abi >= 3:
        write |= LL_TRUNCATE
    attr = _RulesetAttr(read | write, LL_NET_BIND_TCP | LL_NET_CONNECT_TCP if abi >= 4 else 0,
                        LL_SCOPE_ABSTRACT_UNIX | LL_SCOPE_SIGNAL if abi >= 6 else 0)
    fd = _libc.syscall(_SYS_LANDLOCK_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr)),
                       ctypes.c_uint32(0))
    if fd < 0:
        report.miss("landlock", _err("landlock_create_ruleset"))
        return
    try:
        def allow(path, access):
            try:
                pfd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                return
            try:
                if not os.path.isdir(path):
                    access &= _LL_FILE_ONLY
                rule = _PathBeneath(access, pfd)
                if _libc.syscall(_SYS_LANDLOCK_ADD_RULE, ctypes.c_int(fd), ctypes.c_int(1), ctypes.byref(rule),
                                 ctypes.c_uint32(0)) != 0:
                    raise OSError(ctypes.get_errno(), _err(f"landlock_add_rule {path}"))
            finally:
                os.close(pfd)

        for p in readable:
            allow(p, read)
        for p in writable:
            allow(p, read | write)
        for p in files_writable:  # CUDA opens /proc/self/task/TID/comm to write, truncating
            allow(p, read | LL_WRITE_FILE | (LL_TRUNCATE if abi >= 3 else 0))
        for p in listable:  # its entries listed, none of them opened by this rule
            allow(p, LL_READ_DIR)
        if _libc.syscall(_SYS_LANDLOCK_RESTRICT_SELF, ctypes.c_int(fd), ctypes.c_uint32(0)) != 0:
            raise OSError(ctypes.get_errno(), _err("landlock_restrict_self"))
        report.ok("landlock")
        if abi >= 6:
            report.ok("landlock-scopes")
        else:
            report.miss("landlock-scopes", f"Landlock ABI {abi} has no signal and socket scopes (6 needed)")
    except OSError as e:
        report.miss("landlock", e.strerror or str(e))
    finally:
        os.close(fd)


# System calls a kernel candidate has no use for, each a way out of the sandbox or into another
# process; they fail with EPERM. clone3 answers ENOSYS, so glibc falls back to clone, whose
# flags a filter can read: clone with a namespace flag fails too.
_SECCOMP_DENY = ("ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd", "keyctl", "add_key",
                 "request_key", "bpf", "userfaultfd", "mount", "umount2", "pivot_root", "chroot", "unshare", "setns",
                 "mount_setattr", "move_mount", "open_tree", "fsopen", "fsmount", "fspick", "kexec_load",
                 "kexec_file_load", "init_module", "finit_module", "delete_module", "reboot", "swapon", "swapoff",
                 "acct", "quotactl", "io_uring_setup", "io_uring_enter", "io_uring_register", "lookup_dcookie",
                 "open_by_handle_at", "name_to_handle_at", "personality")
_SCMP_ACT_ALLOW = 0x7FFF0000
_SCMP_CMP_EQ = 4
_SCMP_CMP_MASKED_EQ = 7


class _ScmpArgCmp(ctypes.Structure):
    _fields_ = [("arg", ctypes.c_uint), ("op", ctypes.c_int), ("datum_a", ctypes.c_uint64), ("datum_b", ctypes.c_uint64)]


def _load_libseccomp():
    """libseccomp, loaded once when this module is (in the zygote, before any fork: find_library
    runs ldconfig, which a worker should not wait for); None where it is not installed."""
    try:
        return ctypes.CDLL(ctypes.util.find_library("seccomp") or "libseccomp.so.2", use_errno=True)
    except OSError:
        return None


_LIBSECCOMP = _load_libseccomp()


def _seccomp(report):
    lib = _LIBSECCOMP
    if lib is None:
        report.miss("seccomp", "libseccomp is not installed (Debian: libseccomp2)")
        return
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = (ctypes.c_uint32,)
    lib.seccomp_rule_add_array.argtypes = (ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int, ctypes.c_uint,
                                           ctypes.c_void_p)
    lib.seccomp_syscall_resolve_name.argtypes = (ctypes.c_char_p,)
    lib.seccomp_load.argtypes = (ctypes.c_void_p,)
    lib.seccomp_release.argtypes = (ctypes.c_void_p,)
    ctx = lib.seccomp_init(_SCMP_ACT_ALLOW)
    if not ctx:
        report.miss("seccomp", "seccomp_init failed")
        return
    eperm = 0x00050000 | errno.EPERM
    try:
        for call in _SECCOMP_DENY:
            nr = lib.seccomp_syscall_resolve_name(call.encode())
            if nr < 0:
                continue  # not on this architecture
            if lib.seccomp_rule_add_array(ctx, eperm, nr, 0, None) != 0:
                raise OSError(errno.EINVAL, f"seccomp rule for {call}")
        nr = lib.seccomp_syscall_resolve_name(b"clone3")
        if nr >= 0 and lib.seccomp_rule_add_array(ctx, 0x00050000 | errno.ENOSYS, nr, 0, None) != 0:
            raise OSError(errno.EINVAL, "seccomp rule for clone3")
        # The parent-death signal that ties the worker to its keeper stays as it is.
        cmp = _ScmpArgCmp(0, _SCMP_CMP_EQ, PR_SET_PDEATHSIG, 0)
        if lib.seccomp_rule_add_array(ctx, eperm, lib.seccomp_syscall_resolve_name(b"prctl"), 1, ctypes.byref(cmp)) != 0:
            raise OSError(errno.EINVAL, "seccomp rule for prctl(PR_SET_PDEATHSIG)")
        clone = lib.seccomp_syscall_resolve_name(b"clone")
        # CLONE_NEWUTS and CLONE_NEWCGROUP besides the five above.
        for flag in (CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET, CLONE_NEWIPC, 0x04000000, 0x02000000):
            cmp = _ScmpArgCmp(0, _SCMP_CMP_MASKED_EQ, flag, flag)
            if lib.seccomp_rule_add_array(ctx, eperm, clone, 1, ctypes.byref(cmp)) != 0:
                raise OSError(errno.EINVAL, f"seccomp rule for clone flag {flag:#x}")
        if lib.seccomp_load(ctx) != 0:
            raise OSError(errno.EPERM, "seccomp_load failed")
        report.ok("seccomp")
    except OSError as e:
        report.miss("seccomp", e.strerror or str(e))
    finally:
        lib.seccomp_release(ctx)


def enter_zygote():
    """The zygote's confinement: its own mount, network and IPC namespaces (a user namespace
    first where it is not root), every mount read-only, no_new_privs. It keeps what its children
    need to confine themselves further. Returns the report's dict."""
    report = Report(ZYGOTE_LAYERS)
    _namespaces(report, pid=False)
    if "mount-namespace" in report.layers:
        try:
            _mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing we mount reaches the host
            _read_only(report)
        except OSError as e:
            report.miss("read-only-filesystem", e.strerror or str(e))
    _no_new_privs(report)
    return report.as_dict()


def _keep(child):
    """The keeper: the process outside the worker's PID namespace, whose one child is the
    worker. Waits for it and ends as it did (the same exit code, or killed by the same signal),
    so the evaluator sees the worker's end on the keeper. Never returns."""
    os.closerange(3, 65536)
    while True:
        try:
            _, status = os.waitpid(child, 0)
            break
        except InterruptedError:
            continue
        except ChildProcessError:
            os._exit(125)
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
            signal.signal(sig, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, [sig])
        except (OSError, ValueError):
            pass
        os.kill(os.getpid(), sig)
        os._exit(128 + sig)
    os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 125)


def die_with_parent():
    """SIGKILL to this process when its parent goes (PR_SET_PDEATHSIG). A change of identity
    clears it."""
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _keeper_watch(keeper):
    """SIGKILL when the keeper goes, and an end now if it has already gone (its pidfd, opened
    before the fork, is readable): the worker never outlives its keeper."""
    die_with_parent()
    if select.select([keeper], [], [], 0)[0]:
        os._exit(1)


def _wanted(layers):
    """Run as root, no user namespace is needed (nor made): the worker's identity changes."""
    return [x for x in layers if not (x == "user-namespace" and os.geteuid() == 0)]


# The device files a worker without its kind's device_nodes may open (device.py, DeviceKind).
_PLAIN_DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")

# The worker's Landlock rules once they are in force, (readable, writable), for narrow_devices.
_WORKER_RULES = []


def _device_entry(path):
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return False
    return stat.S_ISCHR(mode) or stat.S_ISBLK(mode) or stat.S_ISDIR(mode) or stat.S_ISREG(mode)


def narrow_devices(drop):
    """A second Landlock layer on this worker, stacked on enter_worker's (a layer can only take
    away): the same rules, with the device files in `drop` left out of /dev's (each other entry of
    /dev kept, and /dev itself listable). Its child processes keep it. A CUDA worker drops the
    host's other GPUs' files once its own context exists (device.py, DeviceKind.other_device_files).
    Returns False where no Landlock layer is in force on the worker (nothing to narrow); OSError
    where the new layer cannot be put in force."""
    if not _WORKER_RULES:
        return False
    readable, writable = _WORKER_RULES[0]
    drop = set(drop)
    # Device files and folders only: links (/dev/stderr, /dev/fd) lead where /proc's and /dev's
    # own rules reach, and a socket or pipe takes no rule.
    kept = [p for p in (os.path.join("/dev", n) for n in sorted(os.listdir("/dev")))
            if p not in drop and _device_entry(p)]
    report = Report(("landlock",))
    _landlock(report, readable, writable, kept + ["/proc"], listable=("/dev",))
    if "landlock" not in report.layers:
        raise OSError(errno.EPERM, "narrowing the worker's device files: " + report.missing.get("landlock", "failed"))
    return True


def enter_worker(scratch, socket_path, harness_dir, scratch_mb, device_nodes=True):
    """Confines this process for a candidate, as the module docstring says. `device_nodes`:
    the worker may open every device file under /dev (its kind's DeviceKind.device_nodes);
    without it Landlock lets it open only _PLAIN_DEVICES there. Where a PID
    namespace can be made, this forks: the caller's process becomes the keeper and never
    returns; the child (PID 1 of the new namespace) goes on. Returns the report's dict (what is
    in force and what is missing, with the reasons), for the `started` message; the evaluator
    decides whether it is enough (evaluator.isolation)."""
    report = Report(_wanted(WORKER_LAYERS))
    readable = readable_paths(harness_dir)  # before the mounts: sys.path may name /tmp
    _namespaces(report, pid=True)
    keeper = None
    if "pid-namespace" in report.layers:
        # The keeper's pidfd, opened before the fork: the child cannot name its parent from
        # inside the new namespace, and must not outlive it.
        keeper = os.pidfd_open(os.getpid())
        child = os.fork()
        if child != 0:
            _keep(child)
        _keeper_watch(keeper)
    if "mount-namespace" in report.layers:
        try:
            _mount(None, "/", None, MS_REC | MS_PRIVATE)
            _read_only(report)
            _private_scratch(report, scratch, socket_path, scratch_mb, readable)
            if os.geteuid() == 0:
                _within_reach(readable)
            if "pid-namespace" in report.layers:
                _new_proc(report)
        except OSError as e:
            report.miss("read-only-filesystem", e.strerror or str(e))
    else:
        for layer in ("read-only-filesystem", "private-scratch"):
            report.miss(layer, "no mount namespace")
    try:
        os.chdir(scratch)
    except OSError:
        pass
    _identity(report, [scratch] if "private-scratch" in report.layers else [])
    if keeper is not None:
        # A change of identity clears the parent-death signal: set it again, and make sure the
        # keeper did not go meanwhile.
        _keeper_watch(keeper)
        os.close(keeper)
    _no_new_privs(report)
    writable = ["/tmp", "/dev/shm", scratch]
    _landlock(report, readable, writable, (["/dev"] if device_nodes else list(_PLAIN_DEVICES)) + ["/proc"])
    if "landlock" in report.layers:
        _WORKER_RULES[:] = [(readable, writable)]
    _seccomp(report)
    return report.as_dict()


def probe():
    """What this machine allows, for `crucible info`: a fresh process confined as a worker (no
    socket) reports the layers; this one is left as it was. Returns the report's dict."""
    import json
    import tempfile
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            scratch = tempfile.mkdtemp(prefix="crucible-probe-")
            rep = enter_worker(scratch, None, os.path.dirname(os.path.abspath(__file__)), 16)
            os.write(w, json.dumps(rep).encode())
        except BaseException as e:  # noqa: BLE001  (the probe reports any failure)
            os.write(w, json.dumps({"layers": [], "missing": {"sandbox": repr(e)}, "landlock_abi": 0}).encode())
        os._exit(0)
    os.close(w)
    data = b""
    while True:
        chunk = os.read(r, 65536)
        if not chunk:
            break
        data += chunk
    os.close(r)
    os.waitpid(pid, 0)
    return json.loads(data.decode() or "{}")


if __name__ == "__main__":
    import json
    print(json.dumps(probe()))
