"""Faults for the chaos soak (``bench/harness/chaos.py``, which fires them in its phases; the
clients are ``chaos_traffic.py``): one pod (the gateway with the simulated engine or vLLM, the
proxy in front, real processes on 127.0.0.1) whose processes can be killed, stopped, drained and
restarted while clients use it, whose engine can be killed or hung (the simulated one through the
gateway's fault switch, ``--sim-faults``; vLLM's engine core, named by the gateway's latest
``vllm_worker_ready`` log line, with SIGKILL, SIGSTOP and SIGCONT), and a TCP forwarder between
the proxy and the gateway that can reset every upstream connection at once (or, told to, swallow
a hang-up: the hop in front of a server that `helm test` must catch).

The gateway leads a process group of its own, as a container's processes are all ended together:
vLLM's engine core processes are in it, so killing the gateway kills the group, and once the
gateway has exited (drained) whatever is left of the group is a finding
(:meth:`Pod.take_leftovers`), then killed.

The proxy reaches the gateway only through the forwarders (HTTP and gRPC), so a gateway restarted
on new ports is one retarget away, and an upstream reset is a real TCP RST on both sides of every
connection. Clients read the proxy's current address at each call: a restarted proxy listens on
new ports too.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import struct
from pathlib import Path

import aiohttp
import grpc

from bench.base.addresses import host_port
from bench.base.processes import Process, children, group_members, start
from bench.base.waiting import wait_until
from bench.harness.stack import TOKEN

READY = '"vllm_worker_ready"'
GROUP_EXIT_S = 10.0
"""How long a drained gateway's process group may take to be gone after the gateway exited."""
_RST = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends a reset


def _reset(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RST)
    writer.transport.abort()


class Forwarder:
    """A TCP relay to ``target`` (changeable) that can reset every connection through it.

    Every accepted socket is known from the moment the connection is made (a plain callback,
    before any task runs), and each connection's task lives as long as its sockets: it relays,
    then waits until both sides have flushed and closed. :meth:`close` resets every socket and
    cancels every task, so no socket outlives the forwarder. (A socket left to the garbage
    collector fails whichever later test the collection happens in, with an unclosed-socket
    warning; Python 3.11's stream server leaves open the socket of a handler task cancelled
    before it started, as the test's event loop does to its tasks when it closes.)
    """

    def __init__(self, target: str, *, swallow_hang_ups: bool = False) -> None:
        self.target = target
        self.swallow_hang_ups = swallow_hang_ups
        """When a client closes, keep its upstream connection open and read it to its end, as a
        hop that swallows the hang-up does (a router, a middleware): the server never learns."""
        self._pairs: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()
        self._connections: dict[asyncio.Task[None], asyncio.StreamWriter] = {}
        self._server: asyncio.Server | None = None
        self._closed = False
        self.address = ""

    async def start(self) -> str:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.address = f"127.0.0.1:{self._server.sockets[0].getsockname()[1]}"
        return self.address

    async def close(self) -> None:
        """Stop accepting and reset every connection; returns once their sockets are closed."""
        self._closed = True
        server = self._server
        if server is not None:
            # Stop accepting first, and give what was accepted a loop turn to become a transport
            # before the server closes: Python 3.11's server makes a connection's transport on
            # the turn after its accept, and one made once the server is closed fails silently
            # (its _attach asserts), leaving its socket open. Those reach _accept and are reset.
            loop = asyncio.get_running_loop()
            for listener in server.sockets:
                loop.remove_reader(listener.fileno())
            await asyncio.sleep(0)
            server.close()
        connections = list(self._connections.items())
        for task, client in connections:
            task.cancel()
            _reset(client)
        await asyncio.gather(*(task for task, _ in connections), return_exceptions=True)
        # Until every socket the server accepted is closed (what Server.wait_closed() waits for
        # from Python 3.12 on, not in 3.11): those reset above, and those accepted as it closed.
        if server is not None:

            def all_closed() -> bool:
                active: int = server._active_count  # type: ignore[attr-defined]  # private
                return active == 0

            await wait_until(all_closed, what="the forwarder's sockets closed")

    def reset_all(self) -> int:
        """Reset both sides of every connection through the forwarder; returns how many."""
        pairs, self._pairs = self._pairs, set()
        for client, upstream in pairs:
            _reset(client)
            _reset(upstream)
        return len(pairs)

    def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._closed:  # made as the server closed
            _reset(writer)
            return
        task = asyncio.get_running_loop().create_task(self._relay(reader, writer))
        self._connections[task] = writer
        task.add_done_callback(self._connections.pop)

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sides = [writer]
        closed = False
        try:
            host, port = host_port(self.target)
            try:
                up_reader, up_writer = await asyncio.open_connection(host, port)
            except OSError:  # the gateway is down: the proxy sees its connection reset
                return
            sides.append(up_writer)
            pair = (writer, up_writer)
            self._pairs.add(pair)
            try:
                if self.swallow_hang_ups:
                    gone = asyncio.Event()
                    await asyncio.gather(
                        self._pipe(reader, up_writer, gone=gone),
                        self._pipe(up_reader, writer, unless=gone),
                    )
                else:
                    await asyncio.gather(
                        self._pipe(reader, up_writer), self._pipe(up_reader, writer)
                    )
            finally:
                self._pairs.discard(pair)
            for side in sides:  # what a side still buffers is sent before it closes
                side.close()
                with contextlib.suppress(OSError):
                    await side.wait_closed()
            closed = True
        finally:
            if not closed:  # cancelled, the gateway down, or anything unforeseen
                for side in sides:
                    _reset(side)

    @staticmethod
    async def _pipe(
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        gone: asyncio.Event | None = None,
        unless: asyncio.Event | None = None,
    ) -> None:
        """Copy ``reader`` to ``writer``, then close ``writer``: one side ended, so does the
        other. Swallowing a hang-up: ``gone`` is set when ``reader`` (the client) ends, and
        ``writer`` (the upstream) is left open; once ``unless`` is set, what ``reader`` (the
        upstream) sends is read and dropped, to its end."""
        try:
            while data := await reader.read(65536):
                if unless is not None and unless.is_set():
                    continue
                writer.write(data)
                await writer.drain()
        except OSError:
            pass
        finally:
            if gone is not None:
                gone.set()
            else:
                writer.close()


class Pod:
    """The gateway and the proxy, each restartable; see the module docstring."""

    def __init__(
        self,
        tmp: Path,
        gateway_args: list[str],
        proxy_args: list[str],
        engine: str = "sim",
        gateway_start_s: float = 60.0,
    ) -> None:
        """``gateway_args``: the gateway's options besides ``--engine`` (``engine``: sim or
        vllm), its ports and its cancel token; ``gateway_start_s``: how long it may take to
        serve."""
        self.engine = engine
        self.leftovers: list[str] = []  # processes of a gateway's group that outlived it
        self._stopped_core = 0
        self._tmp = tmp
        self._token = tmp / "cancel-token"
        self._gateway_args = gateway_args
        self._proxy_args = proxy_args
        self._starts = {"gateway": 0, "proxy": 0}
        self.gateway: Process | None = None
        self.proxy: Process | None = None
        self._http = Forwarder("")
        self._grpc = Forwarder("")
        self._channels: dict[str, grpc.aio.Channel] = {}
        self.gateway_start_s = gateway_start_s
        self.steady = asyncio.Event()  # cleared while a fault is being applied
        self.steady.set()

    async def __aenter__(self) -> Pod:
        self._tmp.mkdir(parents=True, exist_ok=True)
        self._token.write_text(TOKEN)
        try:
            await self._start_gateway()
            await self._http.start()
            await self._grpc.start()
            await self._start_proxy()
        except BaseException:
            await self.__aexit__()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        try:
            for channel in self._channels.values():
                await channel.close()
            if self.gateway is not None:
                await self._kill_gateway_group()
            if self.proxy is not None and self.proxy.popen.poll() is None:
                self.proxy.popen.kill()
                await asyncio.to_thread(self.proxy.popen.wait)
        finally:
            await self._http.close()
            await self._grpc.close()

    # -- what clients use -------------------------------------------------------------------

    @property
    def proxy_url(self) -> str:
        assert self.proxy is not None
        return self.proxy.url("http")

    @property
    def gateway_url(self) -> str:
        assert self.gateway is not None
        return self.gateway.url("http")

    def proxy_channel(self) -> grpc.aio.Channel:
        """A channel to the proxy as it is now (one per proxy process)."""
        assert self.proxy is not None
        address = self.proxy.listeners["grpc"]
        if address not in self._channels:
            self._channels[address] = grpc.aio.insecure_channel(address)
        return self._channels[address]

    def gateway_channel(self) -> grpc.aio.Channel:
        assert self.gateway is not None
        address = self.gateway.listeners["grpc"]
        if address not in self._channels:
            self._channels[address] = grpc.aio.insecure_channel(address)
        return self._channels[address]

    def resources(self) -> dict[str, tuple[int, int]]:
        """Each live process's resident memory (KiB) and open files (the proxy's workers
        included)."""
        found = {}
        for name, process in (("gateway", self.gateway), ("proxy", self.proxy)):
            if process is None or process.popen.poll() is not None:
                continue
            rss = files = 0
            for pid in [process.popen.pid, *children(process.popen.pid)]:  # with its workers
                with contextlib.suppress(OSError):  # a worker that just exited
                    status = Path(f"/proc/{pid}/status").read_text()
                    rss += int(status.split("VmRSS:")[1].split()[0])
                    files += len(os.listdir(f"/proc/{pid}/fd"))
            found[name] = (rss, files)
        return found

    def incarnation(self, name: str) -> int:
        return self._starts[name]

    # -- faults ---------------------------------------------------------------------------

    def reset_upstream(self) -> str:
        return f"reset {self._http.reset_all() + self._grpc.reset_all()} upstream connections"

    async def kill_gateway(self) -> str:
        """SIGKILL the gateway's process group (its engine processes too), then restart it."""
        await self._kill_gateway_group()
        await self._start_gateway()
        return "gateway SIGKILL (its process group), restarted"

    async def _kill_gateway_group(self) -> None:
        assert self.gateway is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.gateway.popen.pid, signal.SIGCONT)
            os.killpg(self.gateway.popen.pid, signal.SIGKILL)
        await asyncio.to_thread(self.gateway.popen.wait)

    def take_leftovers(self) -> list[str]:
        """The processes found outliving a gateway that exited by itself since the last call."""
        found, self.leftovers = self.leftovers, []
        return found

    def pause_gateway(self) -> None:
        """SIGSTOP the gateway (:meth:`resume_gateway` continues it)."""
        assert self.gateway is not None
        self.gateway.popen.send_signal(signal.SIGSTOP)

    def resume_gateway(self) -> None:
        assert self.gateway is not None
        self.gateway.popen.send_signal(signal.SIGCONT)

    async def engine_fault(self, fault: str) -> str:
        """``kill``, ``hang`` or ``resume`` the gateway's engine (worker 0): the simulated one
        through its fault switch, vLLM's engine core with SIGKILL, SIGSTOP, SIGCONT."""
        if self.engine == "vllm":
            return self._signal_engine_core(fault)
        url = f"{self.gateway_url}/v2/admin/workers/0/fault"
        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with (
            aiohttp.ClientSession() as session,
            session.post(url, json={"fault": fault}, headers=headers) as resp,
        ):
            text = await resp.text()
            if resp.status != 200:
                raise RuntimeError(f"fault switch {fault}: {resp.status} {text}")
        return f"simulated engine 0 {fault}"

    def _signal_engine_core(self, fault: str) -> str:
        assert self.gateway is not None
        if fault == "resume":
            pid, self._stopped_core = self._stopped_core, 0
        else:
            ready = [line for line in self.gateway.log().splitlines() if READY in line]
            pid = int(json.loads(ready[-1])["engine_core_pids"][0])
        sent = {"kill": signal.SIGKILL, "hang": signal.SIGSTOP, "resume": signal.SIGCONT}[fault]
        os.kill(pid, sent)
        if fault == "hang":
            self._stopped_core = pid
        return f"vLLM engine core {pid} {sent.name}"

    async def drain_gateway(self) -> str:
        """SIGTERM the gateway; once it has exited, nothing of its process group may be left."""
        assert self.gateway is not None
        code = await asyncio.to_thread(self.gateway.terminate, 120)
        group = self.gateway.popen.pid
        # multiprocessing's resource tracker leaves once it reads the end of its pipe.
        with contextlib.suppress(AssertionError):
            await wait_until(lambda: not group_members(group), within=GROUP_EXIT_S,
                             what="the drained gateway's process group to end")  # fmt: skip
        if left := group_members(group):
            self.leftovers += [f"pid {pid} of the drained gateway {group}" for pid in left]
            await self._kill_gateway_group()
        await self._start_gateway()
        return f"gateway SIGTERM (exit {code}), restarted"

    async def kill_proxy(self) -> str:
        assert self.proxy is not None
        self.proxy.popen.kill()
        await asyncio.to_thread(self.proxy.popen.wait)
        await self._start_proxy()
        return "proxy SIGKILL, restarted"

    async def kill_proxy_worker(self) -> str:
        """SIGKILL one of the proxy's worker processes (``--workers`` > 1); its supervisor
        starts another."""
        assert self.proxy is not None
        workers = children(self.proxy.popen.pid)
        if not workers:
            raise RuntimeError("the proxy has no worker processes: start it with --workers 2")
        os.kill(workers[0], signal.SIGKILL)
        return f"proxy worker {workers[0]} SIGKILL (its supervisor starts another)"

    async def drain_proxy(self) -> str:
        assert self.proxy is not None
        code = await asyncio.to_thread(self.proxy.terminate)
        await self._start_proxy()
        return f"proxy SIGTERM (exit {code}), restarted"

    # -- processes ------------------------------------------------------------------------

    async def _start_gateway(self) -> None:
        self._starts["gateway"] += 1
        args = ["--engine", self.engine, "--http-port", "0", "--grpc-port", "0",
                "--cancel-token-file", str(self._token), *self._gateway_args]  # fmt: skip
        where = self._tmp / f"gateway-{self._starts['gateway']}"
        self.gateway = await asyncio.to_thread(
            start, "gateway_server", args, where, timeout=self.gateway_start_s, own_group=True
        )
        self._http.target = self.gateway.listeners["http"]
        self._grpc.target = self.gateway.listeners["grpc"]

    async def _start_proxy(self) -> None:
        self._starts["proxy"] += 1
        args = ["--http-port", "0", "--grpc-port", "0", "--admin-port", "0",
                "--upstream-http", f"http://{self._http.address}",
                "--upstream-grpc", self._grpc.address,
                "--cancel-token-file", str(self._token), *self._proxy_args]  # fmt: skip
        where = self._tmp / f"proxy-{self._starts['proxy']}"
        self.proxy = await asyncio.to_thread(start, "proxy", args, where)
