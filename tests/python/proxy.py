"""A TCP proxy on loopback whose connections a test can cut: the way to
break a client's stream to a server that stays up (and so can be changed,
compacted... meanwhile). It can also stall them: keep them open and forward
nothing, as a stuck middlebox does (a stream that neither ends nor fails)."""

from __future__ import annotations

import socket
import threading
from typing import List, Tuple


class Proxy:
    def __init__(self, target: str) -> None:
        host, port = target.removeprefix("http://").rsplit(":", 1)
        self.target = (host, int(port))
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.endpoint = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.lock = threading.Lock()
        self.refusing = False
        self.closed = False
        self.connections: List[Tuple[socket.socket, socket.socket]] = []
        #: set while the connections made since the last `stall` forward
        self.flowing = threading.Event()
        self.flowing.set()
        #: the events of stalled connections, set again by `cut` (their
        #: sockets closed, the pumps then end)
        self.stalled: List[threading.Event] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            with self.lock:
                if self.refusing or self.closed:
                    client.close()
                    continue
                try:
                    server = socket.create_connection(self.target, timeout=5)
                except OSError:
                    client.close()
                    continue
                server.settimeout(None)
                self.connections.append((client, server))
                flowing = self.flowing
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b, flowing), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket, flowing: threading.Event) -> None:
        try:
            while data := source.recv(65536):
                flowing.wait()  # a stalled connection swallows what it reads
                sink.sendall(data)
        except OSError:
            pass
        for s in (source, sink):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def cut(self) -> None:
        """Closes every connection and refuses new ones until `heal`."""
        with self.lock:
            self.refusing = True
            connections, self.connections = self.connections, []
            stalled, self.stalled = self.stalled, []
        for pair in connections:
            for s in pair:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()
        for event in stalled:
            event.set()

    def stall(self) -> None:
        """The connections open now stay open and forward nothing from now
        on (until `cut`); new ones forward as usual."""
        with self.lock:
            stalled, self.flowing = self.flowing, threading.Event()
            self.flowing.set()
            self.stalled.append(stalled)
        stalled.clear()

    def heal(self) -> None:
        with self.lock:
            self.refusing = False

    def close(self) -> None:
        self.cut()
        with self.lock:
            self.closed = True
        self.listener.close()
