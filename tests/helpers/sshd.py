"""A real OpenSSH server on 127.0.0.1 for DVC's SSH remote: throwaway host and user keys, a non-default port.

It logs in the current account only (by key), serves SFTP in-process and listens on loopback alone.
"""

from __future__ import annotations

import getpass
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.helpers.servers import closed_port

INSTALL = "apt-get install -y openssh-server (Debian/Ubuntu: /usr/sbin/sshd)"
START_LIMIT_S = 20.0


@dataclass(frozen=True)
class SshServer:
    port: int
    user: str
    key: Path  # authorized
    stranger_key: Path  # a valid key the server does not know
    log: Path

    def url(self, folder: Path) -> str:
        return f"ssh://{self.user}@127.0.0.1:{self.port}{folder}"


def sshd_program() -> str:
    found = shutil.which("sshd") or ("/usr/sbin/sshd" if Path("/usr/sbin/sshd").is_file() else None)
    assert found, f"OpenSSH's server is not installed; run `{INSTALL}`."
    return found


def _key(path: Path) -> Path:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return path


@contextmanager
def running_sshd(folder: Path) -> Iterator[SshServer]:
    program = sshd_program()
    folder.mkdir(parents=True, exist_ok=True)
    host_key, key, stranger = _key(folder / "host_key"), _key(folder / "user_key"), _key(folder / "stranger_key")
    authorized = folder / "authorized_keys"
    shutil.copy(key.with_suffix(".pub"), authorized)
    port = closed_port()
    config = folder / "sshd_config"
    config.write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {host_key}\nPidFile {folder / 'sshd.pid'}\n"
        f"AuthorizedKeysFile {authorized}\nPubkeyAuthentication yes\nPasswordAuthentication no\n"
        "KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\nPermitRootLogin prohibit-password\n"
        f"AllowUsers {getpass.getuser()}\nSubsystem sftp internal-sftp\nLogLevel VERBOSE\n"
    )
    if os.geteuid() == 0:
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # root's sshd needs its privilege-separation folder
    log = folder / "sshd.log"
    with log.open("w") as output:
        process = subprocess.Popen([program, "-D", "-e", "-f", str(config)], stdout=output, stderr=output)
    try:
        deadline = time.monotonic() + START_LIMIT_S
        while True:
            assert process.poll() is None, f"sshd exited: {log.read_text()[-1500:]}"
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, f"sshd did not listen on {port}: {log.read_text()[-1500:]}"
                time.sleep(0.1)
        yield SshServer(port, getpass.getuser(), key, stranger, log)
    finally:
        process.terminate()
        process.wait(timeout=10)
