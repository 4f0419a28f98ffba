"""A PN532 on a pty: enough of the chip's UART protocol for nfcpy's `pn532` driver to
open it, poll for FeliCa cards, and check that a card is still there.

Frames are the PN532's normal information frames (00 00 FF LEN LCS D4 CMD ... DCS 00),
each acknowledged, then answered with D5 CMD+1. A test puts a card on the simulated
field with present(idm) and takes it away with remove(). Commands the simulator does
not model (register writes, RF settings) are acknowledged with an empty answer; every
command seen is kept in `commands` for inspection.
"""

from __future__ import annotations

import os
import select
import threading

ACK = bytes.fromhex("0000ff00ff00")
PMM = bytes.fromhex("0100000000000000")
SYSTEM_CODE = bytes.fromhex("0003")
FIRMWARE = bytes([0x32, 0x01, 0x06, 0x07])  # PN532 v1.6, ISO/IEC 14443 A+B and 18092


def frame(payload: bytes) -> bytes:
    n = len(payload)
    if n < 255:
        head = bytes([0, 0, 0xFF, n, (0x100 - n) & 0xFF])
    else:  # extended frame: FF FF, a 16-bit length and its checksum
        head = bytes([0, 0, 0xFF, 0xFF, 0xFF, n >> 8, n & 0xFF, (0x100 - (n >> 8) - (n & 0xFF)) & 0xFF])
    return head + payload + bytes([(0x100 - sum(payload)) & 0xFF, 0])


class PN532Simulator:
    def __init__(self) -> None:
        self.master, slave = os.openpty()
        self.path = os.ttyname(slave)
        os.close(slave)  # the driver opens its own end
        self.commands: list[int] = []
        self._seen = threading.Condition()  # notified by the serving thread on every command
        self.idm: bytes | None = None
        self._buf = b""
        self._stop_r, self._stop_w = os.pipe()
        self._thread = threading.Thread(target=self._serve, name="pn532-sim", daemon=True)
        self._thread.start()

    def present(self, idm_hex: str) -> None:
        self.idm = bytes.fromhex(idm_hex)

    def wait_commands(self, cmd: int, count: int, timeout: float = 20.0) -> bool:
        """Block until the driver has sent `cmd` `count` times in all."""
        with self._seen:
            return self._seen.wait_for(lambda: self.commands.count(cmd) >= count, timeout)

    def remove(self) -> None:
        self.idm = None

    def close(self) -> None:
        os.write(self._stop_w, b"x")
        self._thread.join(5)
        for fd in (self.master, self._stop_r, self._stop_w):
            os.close(fd)

    def _serve(self) -> None:
        while True:
            ready, _, _ = select.select([self.master, self._stop_r], [], [])
            if self._stop_r in ready:
                return
            try:
                self._buf += os.read(self.master, 4096)
            except OSError:  # no slave open at the moment
                continue
            while (payload := self._next_frame()) is not None:
                if payload and payload[0] == 0xD4 and len(payload) >= 2:
                    with self._seen:
                        self.commands.append(payload[1])
                        self._seen.notify_all()
                    os.write(self.master, ACK + frame(bytes([0xD5, payload[1] + 1]) + self._answer(payload[1], payload[2:])))

    def _next_frame(self) -> bytes | None:
        """The payload (TFI onwards) of the next whole frame in the buffer; b"" for an ACK."""
        start = self._buf.find(b"\x00\xff")
        if start < 0 or len(self._buf) < start + 4:
            return None
        n, lcs = self._buf[start + 2], self._buf[start + 3]
        if n == 0 and lcs == 0xFF:  # the host's ACK
            self._buf = self._buf[start + 5:]
            return b""
        body = start + 4
        if n == 0xFF and lcs == 0xFF:  # extended frame
            if len(self._buf) < start + 7:
                return None
            n, body = self._buf[start + 4] << 8 | self._buf[start + 5], start + 7
        elif (n + lcs) & 0xFF:  # not a frame after all: skip the false start
            self._buf = self._buf[start + 2:]
            return b""
        if len(self._buf) < body + n + 2:
            return None
        payload = self._buf[body:body + n]
        self._buf = self._buf[body + n + 2:]
        return payload

    def _answer(self, cmd: int, data: bytes) -> bytes:
        if cmd == 0x00:  # Diagnose: the line test echoes its data
            return data
        if cmd == 0x02:  # GetFirmwareVersion
            return FIRMWARE
        if cmd == 0x06:  # ReadRegister: one value per 16-bit address
            return bytes(len(data) // 2)
        if cmd == 0x4A:  # InListPassiveTarget (max targets, bitrate, SENSF_REQ)
            if self.idm is None or data[1] not in (1, 2):
                return b"\x00"
            sensf = b"\x01" + self.idm + PMM + (SYSTEM_CODE if data[5:6] == b"\x01" else b"")
            return bytes([1, 1, len(sensf) + 1]) + sensf
        if cmd == 0x42:  # InCommunicateThru: a FeliCa command with its length byte
            if self.idm is None:
                return b"\x01"  # timeout: nobody answered
            if data[1:2] == b"\x00":  # Polling
                rsp = b"\x01" + self.idm + PMM
                return b"\x00" + bytes([len(rsp) + 1]) + rsp
            return b"\x01"
        return b""  # SAMConfiguration, SetParameters, RFConfiguration, WriteRegister, SetSerialBaudRate
