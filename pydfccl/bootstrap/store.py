"""The key-value store that ranks started without MPI meet at (torchrun-style variables;
under torchrun itself its agent's store is used instead, ``c10d.py``).

Rank 0 serves it on ``MASTER_ADDR:MASTER_PORT`` (loopback unless told otherwise); every rank,
rank 0 included, asks it through short connections. On top of ``set`` and ``get`` (which
waits for the key) it offers what the bootstrap needs of a process group: ``bcast``,
``allgather`` and ``Barrier``, with mpi4py's names, so that ``pydfccl.bootstrap.mpi`` builds
a world the same way over either.

Only the job's own processes can drive it:

- **A secret.** Every request and every reply carries an HMAC-SHA256 over the other side's
  fresh nonce and the message, keyed by the job's secret: ``PYDFCCL_SECRET`` when set (the
  same value on every rank; needed when ranks span hosts), else a random one that rank 0
  writes to a file only its user can read (``secret_path``) and the other ranks of the host
  read. A client without it is refused; a server without it is not believed.
- **Job-scoped.** A request names the job (``PYDFCCL_JOB_ID``, torchrun's run id, else the
  port) and its size; another job's request is refused with both named. It names its rank
  and a random token of its process too: the first process to speak as a rank holds that
  rank, and another one (a second job started on the same port, whose ranks read the
  first's secret file before the first job's ranks met) is refused, naming the clash.
- **No code on the wire.** Messages are JSON (``wire``), never pickle.
- **No stalls.** Each connection has its own thread and time limits, at most
  ``MAX_CONNECTIONS`` at once; a connection that sends garbage, too much, or nothing is
  dropped and the store goes on.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import os
import secrets
import socket
import stat
import tempfile
import threading
import time

from ..errors import PydfcclError
from .wire import WireError, from_plain, recv_exactly, recv_frame, send_frame, to_plain

__all__ = ["StoreGroup", "StoreServer", "env_group", "free_port", "in_env_job", "job_id",
           "secret_path", "JOIN_TIMEOUT"]

JOIN_TIMEOUT = float(os.environ.get("PYDFCCL_JOIN_TIMEOUT", "120"))
MAGIC = b"PYDFCCL1"
REFUSED = b"refused: not this job's secret"
NONCE_BYTES = 16
REQUEST_SECONDS = 10.0        # to send a request once connected, and to read a reply's start
MAX_CONNECTIONS = 256
RETRY_SECONDS = 0.1


def in_env_job() -> bool:
    """Whether torchrun-style variables (RANK, WORLD_SIZE > 1) describe this process."""
    return "RANK" in os.environ and int(os.environ.get("WORLD_SIZE", "1")) > 1


def env_group(timeout: float = JOIN_TIMEOUT):
    """This process's group when torchrun-style variables describe it: under torchrun the
    store torchrun's agent serves, else one that rank 0 serves (``StoreGroup``)."""
    from .c10d import torchrun_group, under_torchrun

    return torchrun_group(timeout) if under_torchrun() else StoreGroup(timeout=timeout)


def _first_ephemeral_port() -> int:
    """Where the range the kernel takes outgoing connections' ports from starts (Linux's
    default when it cannot be read)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port(host: str = "127.0.0.1") -> int:
    """A port on ``host`` that nothing listens on now, for rank 0's store. It is drawn below
    the range of outgoing connections' ports: a port the kernel hands out (``bind(0)``) can
    be given to a client socket before rank 0 binds it, most often on a machine where many
    connections come and go."""
    low = _first_ephemeral_port()
    for _ in range(200):
        port = 10000 + secrets.randbelow(low - 10000) if low > 11000 else 0
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return s.getsockname()[1]
    raise PydfcclError(f"no free port on {host} below {low}")


def job_id(port: int) -> str:
    """The job a store serves: ``PYDFCCL_JOB_ID``, torchrun's run id, else the port."""
    env = os.environ
    return env.get("PYDFCCL_JOB_ID") or env.get("TORCHELASTIC_RUN_ID") or f"port-{port}"


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(socket.gethostbyname(host)).is_loopback
    except (OSError, ValueError):
        return False


def secret_path(job: str) -> str:
    """Where rank 0 leaves a job's generated secret for the host's other ranks: a file in a
    directory only this user can enter (``$XDG_RUNTIME_DIR/pydfccl``, else
    ``<tmp>/pydfccl-<uid>``)."""
    base = os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir()
    folder = os.path.join(base, "pydfccl" if "XDG_RUNTIME_DIR" in os.environ
                          else f"pydfccl-{os.getuid()}")
    os.makedirs(folder, mode=0o700, exist_ok=True)
    info = os.lstat(folder)
    if info.st_uid != os.getuid() or stat.S_IMODE(info.st_mode) & 0o077 \
            or not stat.S_ISDIR(info.st_mode):
        raise PydfcclError(f"pydfccl: {folder} must be a directory of this user's that no "
                           "one else can enter (it holds the bootstrap's secret)")
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in job)
    return os.path.join(folder, f"{safe}.secret")


def _write_secret(path: str) -> bytes:
    value = secrets.token_hex(32).encode()
    tmp = f"{path}.{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(value)
    os.replace(tmp, path)
    return value


def _read_secret(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read().strip() or None
    except FileNotFoundError:
        return None


def _mac(secret: bytes, nonce: bytes, body: bytes) -> bytes:
    return hmac.new(secret, nonce + body, hashlib.sha256).digest()


class StoreServer:
    """Rank 0's store: a thread that accepts connections, and a thread per connection."""

    def __init__(self, address, job: str, size: int, secret: bytes | None):
        self.job, self.size, self._secret = job, size, secret
        self.data: dict = {}
        self.holders: dict = {}    # rank: the token of the process that spoke as it first
        self.cond = threading.Condition()
        # replies decided but not yet sent: rank 0 must not exit before they go out (a rank
        # whose last request was answered in the store but not on the wire would retry
        # against a closed port until its join timeout)
        self.owed = 0
        self._open = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self.refused = 0      # connections dropped: not this job's, or not the protocol
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self._sock.bind(address)
        except OSError as exc:
            self._sock.close()
            raise PydfcclError(
                f"rank 0 cannot serve the bootstrap store at {address[0]}:{address[1]}: {exc} "
                "(another job or program holds the port: choose another MASTER_PORT; under "
                "torchrun pydfccl uses torchrun's own store)") from None
        self._sock.listen(128)
        self._closed = False
        threading.Thread(target=self._accept, name="pydfccl-store", daemon=True).start()

    @property
    def port(self) -> int:
        return self._sock.getsockname()[1]

    def set_secret(self, secret: bytes) -> None:
        """The job's secret, once the port is this server's (until then nobody gets in)."""
        self._secret = secret

    def close(self) -> None:
        self._closed = True
        self._sock.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            if not self._open.acquire(blocking=False):
                conn.close()             # too many at once: this one goes
                continue
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        owes = False
        try:
            conn.settimeout(REQUEST_SECONDS)
            nonce = secrets.token_bytes(NONCE_BYTES)
            conn.sendall(MAGIC + nonce)
            body = recv_frame(conn)
            mac = recv_frame(conn, limit=64)
            if self._secret is None or not hmac.compare_digest(
                    mac, _mac(self._secret, nonce, body)):
                send_frame(conn, REFUSED)   # unsigned: it only makes the client give up
                raise WireError("a request without this job's secret")
            request = json.loads(body.decode())
            reply = self._handle(request)
            owes = True                        # counted in ``owed`` until sent
            out = json.dumps(reply).encode()
            conn.settimeout(REQUEST_SECONDS)
            send_frame(conn, out)
            send_frame(conn, _mac(self._secret, bytes.fromhex(request["nonce"]), out))
        except (OSError, ValueError, KeyError, TypeError, ConnectionError):
            with self.cond:
                self.refused += 1
        finally:
            conn.close()
            self._open.release()
            if owes:
                self._paid()

    def _paid(self) -> None:
        """A counted reply went out (or its connection failed)."""
        with self.cond:
            self.owed -= 1
            self.cond.notify_all()

    def wait_for_replies(self, timeout: float = REQUEST_SECONDS) -> None:
        """Return once every reply the store has decided is sent (or ``timeout``)."""
        with self.cond:
            self.cond.wait_for(lambda: self.owed == 0, timeout=timeout)

    def _handle(self, request: dict) -> dict:
        """The reply to ``request``. Every reply is counted in ``owed`` as it is decided,
        under the lock (so before a waiter can see what the request did), until ``_serve``
        has sent it; a ``get`` waiting for its key is not counted while it waits."""
        with self.cond:
            return self._owe(self._decide(request))

    def _owe(self, reply: dict) -> dict:
        self.owed += 1
        return reply

    def _decide(self, request: dict) -> dict:
        """``_handle``'s reply (lock held; a ``get`` waits on the condition, letting go)."""
        if request.get("job") != self.job or request.get("size") != self.size:
            return dict(error=f"this store serves job {self.job!r} of {self.size} ranks, "
                              f"not job {request.get('job')!r} of {request.get('size')}")
        rank, token = request.get("rank"), request.get("token")
        if not isinstance(rank, int) or not 0 <= rank < self.size:
            return dict(error=f"rank {rank!r} is not a rank of a job of {self.size}")
        op, key = request["op"], str(request["key"])
        if self.holders.setdefault(rank, token) != token:
            return dict(error=f"another process already joined job {self.job!r} as "
                              f"rank {rank}: two jobs on one port? Give each job its "
                              "own MASTER_PORT or PYDFCCL_JOB_ID")
        if op == "set":
            self.data[key] = request["value"]
            self.cond.notify_all()
            return dict(found=True)
        if op == "get":
            wait = min(float(request.get("timeout", 0)), JOIN_TIMEOUT)
            found = self.cond.wait_for(lambda: key in self.data, timeout=wait)
            return dict(found=found, value=self.data.get(key))
        return dict(error=f"unknown store operation {op!r}")


class StoreGroup:
    """This process's rank in a group that meets at ``MASTER_ADDR:MASTER_PORT``."""

    def __init__(self, rank: int | None = None, size: int | None = None, address=None,
                 timeout: float = JOIN_TIMEOUT, job: str | None = None,
                 secret: bytes | str | None = None):
        env = os.environ
        self.rank = int(env["RANK"]) if rank is None else rank
        self.size = int(env["WORLD_SIZE"]) if size is None else size
        self.address = address or (env.get("MASTER_ADDR", "127.0.0.1"),
                                   int(env.get("MASTER_PORT", "29500")))
        self.timeout = timeout
        self.job = job or job_id(self.address[1])
        given = secret if secret is not None else env.get("PYDFCCL_SECRET")
        self._secret = given.encode() if isinstance(given, str) else given
        self._path = None
        if self._secret is None:
            if not _is_loopback(self.address[0]):
                raise PydfcclError(
                    f"rank {self.rank}: MASTER_ADDR {self.address[0]} is not this host's "
                    "loopback, so set PYDFCCL_SECRET to the same private value on every "
                    "rank (the store refuses anyone without it)")
            self._path = secret_path(self.job)
        self._token = secrets.token_hex(16)    # this process, as this rank (``holders``)
        self._server = None
        if self.rank == 0:      # the port first: a second job on it fails before its secret
            self._server = StoreServer(self.address, self.job, self.size, None)
            if self._secret is None:
                self._secret = _write_secret(self._path)
            self._server.set_secret(self._secret)
        self._round = 0

    # -- one request ----------------------------------------------------------------------

    def _secret_now(self) -> bytes | None:
        """The secret, or the file's (re-read until a request with it succeeds: rank 0 may
        not have written it yet, or a stale one may be there)."""
        if self._secret is None and self._path is not None:
            return _read_secret(self._path)
        return self._secret

    def _request(self, secret: bytes, request: dict, seconds: float) -> dict:
        nonce = secrets.token_bytes(NONCE_BYTES)
        body = json.dumps(dict(request, job=self.job, size=self.size, rank=self.rank,
                               token=self._token, nonce=nonce.hex())).encode()
        with socket.create_connection(self.address, timeout=REQUEST_SECONDS) as sock:
            hello = recv_exactly(sock, len(MAGIC) + NONCE_BYTES)
            if not hello.startswith(MAGIC):
                raise WireError("not a pydfccl store")
            send_frame(sock, body)
            send_frame(sock, _mac(secret, hello[len(MAGIC):], body))
            sock.settimeout(seconds + REQUEST_SECONDS)
            reply = recv_frame(sock)
            if reply == REFUSED:
                raise WireError("the store refused this rank's secret (is PYDFCCL_SECRET "
                                "the same on every rank?)")
            mac = recv_frame(sock, limit=64)
        if not hmac.compare_digest(mac, _mac(secret, nonce, reply)):
            raise WireError("a reply without this job's secret")
        return json.loads(reply.decode())

    def _call(self, request: dict, seconds: float = 0.0) -> dict:
        deadline = time.monotonic() + self.timeout
        why = "no answer"
        while True:
            secret = self._secret_now()
            if secret is not None:
                try:
                    reply = self._request(secret, request, seconds)
                    self._secret = secret
                    if "error" in reply:
                        raise PydfcclError(f"rank {self.rank}: the bootstrap store at "
                                           f"{self.address[0]}:{self.address[1]}: "
                                           f"{reply['error']}")
                    return reply
                except (ConnectionError, OSError, WireError) as exc:
                    why = str(exc) or type(exc).__name__   # not up yet, or not this job's
            else:
                why = f"no secret at {self._path} (rank 0 writes it)"
            if time.monotonic() > deadline:
                raise PydfcclError(f"rank {self.rank}: no store of job {self.job!r} at "
                                   f"{self.address[0]}:{self.address[1]} (rank 0) within "
                                   f"{self.timeout:.0f} s: {why}")
            time.sleep(RETRY_SECONDS)

    # -- what the bootstrap uses ----------------------------------------------------------

    def set(self, key: str, value) -> None:
        self._call(dict(op="set", key=key, value=to_plain(value)))

    def get(self, key: str, who: int):
        reply = self._call(dict(op="get", key=key, timeout=self.timeout), self.timeout)
        if not reply["found"]:
            raise PydfcclError(f"rank {who} did not arrive within {self.timeout:.0f} s "
                               f"(waiting for {key!r})")
        return from_plain(reply["value"])

    def allgather(self, obj) -> list:
        """Every rank's ``obj``. Rank 0 returns only once every rank has read them all: it
        serves the store, and a rank that reads after rank 0 exits would find no one."""
        self._round += 1
        key = str(self._round)
        self.set(f"{key}/{self.rank}", obj)
        values = [self.get(f"{key}/{r}", r) for r in range(self.size)]
        self.set(f"{key}/read/{self.rank}", True)
        if self.rank == 0:
            for r in range(self.size):
                self.get(f"{key}/read/{r}", r)
            self._server.wait_for_replies()     # the last "read" set's reply included
            if self._round == 1 and self._path is not None:
                _remove(self._path)        # every rank has the secret now
        return values

    def bcast(self, obj, root: int = 0):
        return self.allgather(obj if self.rank == root else None)[root]

    def Barrier(self) -> None:      # mpi4py's name, so both groups serve pydfccl.bootstrap.mpi
        self.allgather(None)


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
