"""Real mail servers for the feedback-loop tests: Dovecot serving a Maildir over IMAP, and a
private Postfix instance that turns mail to an error domain into real DSNs and delivers them
into that Maildir.

Fixtures (registered through ``pytest_plugins`` in tests/conftest.py):

- ``dovecot``: a :class:`Dovecot` on a free 127.0.0.1 port, plaintext login (``ssl = no``,
  a passwd-file with one user, ``bounces``) over a fresh Maildir; its own config file, base_dir
  and log in a temporary directory, run in the foreground (``dovecot -c CONF -F``) and
  terminated after the test;
- ``dovecot_users``: the same with two more users, ``ann`` and ``bob`` (one per sender), each
  with a Maildir and a password of its own (``Dovecot.users``);
- ``postfix``: a :class:`Postfix` instance (its own ``config_directory``, ``queue_directory`` and
  ``data_directory``, ``postfix -c DIR start``, ``stop`` after the test) whose smtpd listens on
  a free 127.0.0.1 port and accepts everything from loopback
  (``smtpd_reject_unlisted_recipient = no``), but for ``reject.example``, refused at RCPT with
  ``550 5.1.1`` (``check_recipient_access``: no DSN, the sender sees the refusal).
  ``transport_maps`` sends ``bad.example`` to ``error:5.1.1 user unknown`` (accepted, then
  bounced: the DSN is real) and ``sink.example`` to ``discard:`` (delivered nowhere); mail to
  ``bounce.example`` (the VERP bounce addresses, the feedback mailbox) is delivered by
  Postfix's ``virtual`` agent into the Dovecot Maildir, and mail to ``<user>@inbox.example``
  into the Maildir of that Dovecot user (``dovecot_users``). :meth:`Postfix.submit` mails a message
  through it, as the outside world would (a reply, an abuse report).

Privileges: Postfix's master must start as root (it drops to ``mail_owner=postfix`` itself), so
the ``postfix`` fixture needs root, the ``postfix`` user and the ``postdrop`` group, as CI has.
Dovecot runs as root too when the tests do (its login and internal processes then run as the
Debian package's ``dovenull`` and ``dovecot`` users, and mail access as ``nobody``, who owns the
Maildir); as another user it runs with that user for all three. Both go in one directory under
/tmp with mode 0755, as the unprivileged processes must reach the Maildir.

A missing binary (or, for Postfix, not being root) skips locally and fails in CI
(:func:`tests.conftest.missing`). Outside pytest (the benchmarks), :func:`dovecot_missing`
says why Dovecot cannot run and :func:`running_dovecot` runs one.
"""

from __future__ import annotations

import contextlib
import grp
import os
import pwd
import shutil
import smtplib
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

__all__ = [
    "Dovecot",
    "Postfix",
    "dovecot",
    "dovecot_missing",
    "dovecot_users",
    "free_port",
    "mail_root",
    "postfix",
    "running_dovecot",
    "running_postfix",
]

DOVECOT = Path("/usr/sbin/dovecot")
POSTFIX = Path("/usr/sbin/postfix")
#: Mail to this domain is bounced by Postfix with 5.1.1.
ERROR_DOMAIN = "bad.example"
#: Mail to this domain is accepted and discarded.
SINK_DOMAIN = "sink.example"
#: Mail to this domain is refused at RCPT with 550 5.1.1.
REJECT_DOMAIN = "reject.example"
#: The domain of the VERP bounce addresses: delivered into the Dovecot Maildir.
BOUNCE_DOMAIN = "bounce.example"
#: Mail to ``<user>@`` this domain is delivered into that Dovecot user's own Maildir.
INBOX_DOMAIN = "inbox.example"


def _missing(reason: str) -> None:
    from tests.conftest import missing

    missing(reason)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_for_port(port: int, process: subprocess.Popen[bytes] | None, log: Path) -> None:
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            break
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
            return
        time.sleep(0.05)
    text = log.read_text(errors="replace") if log.exists() else "(no log)"
    raise RuntimeError(f"the server did not listen on 127.0.0.1:{port}:\n{text[-3000:]}")


@dataclass(frozen=True)
class MailUser:
    """Who owns the Maildir and runs mail access (uid, gid), and the Dovecot service users."""

    uid: int
    gid: int
    internal_user: str
    login_user: str


def _mail_user() -> MailUser:
    """Raises KeyError when a user Dovecot needs is missing (see :func:`dovecot_missing`)."""
    if os.geteuid() != 0:
        me = pwd.getpwuid(os.geteuid()).pw_name
        return MailUser(os.geteuid(), os.getegid(), me, me)
    pwd.getpwnam("dovecot")
    pwd.getpwnam("dovenull")
    nobody = pwd.getpwnam("nobody")
    return MailUser(nobody.pw_uid, nobody.pw_gid, "dovecot", "dovenull")


def dovecot_missing() -> str | None:
    """Why Dovecot cannot run here; None when it can."""
    if not DOVECOT.exists():
        return f"{DOVECOT} not found (Debian: apt-get install dovecot-imapd)"
    try:
        _mail_user()
    except KeyError as exc:
        return f"Dovecot as root needs the dovecot, dovenull and nobody users: {exc}"
    return None


@pytest.fixture
def mail_root() -> Iterator[Path]:
    """A directory under /tmp that the mail servers' unprivileged processes can traverse."""
    root = Path(tempfile.mkdtemp(prefix="sq-mail-"))
    root.chmod(0o755)
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


@dataclass(frozen=True)
class MailboxUser:
    """One passwd-file user of the Dovecot: its name, password and Maildir (its home)."""

    name: str
    password: str
    maildir: Path


@dataclass
class Dovecot:
    """A running Dovecot serving each user's Maildir (its INBOX) over plaintext IMAP; ``user``
    (``bounces``) is the feedback mailbox, ``users`` every user by name, that one included."""

    port: int
    user: str
    password: str
    maildir: Path
    owner: MailUser
    log: Path
    users: dict[str, MailboxUser] = field(default_factory=dict)

    @property
    def url(self) -> str:
        """The SENDQUEUE_FEEDBACK_IMAP of the INBOX."""
        return self.url_of(self.user)

    def url_of(self, user: str, *, password: str | None = None) -> str:
        """The IMAP URL of ``user``'s INBOX (with another ``password``, for a wrong one)."""
        secret = self.users[user].password if password is None else password
        return f"imap://{user}:{secret}@127.0.0.1:{self.port}/INBOX?security=none"

    def client(self, user: str | None = None) -> object:
        """A logged-in imapclient.IMAPClient of ``user`` (default: ``bounces``); the caller
        logs out."""
        from imapclient import IMAPClient

        who = self.users[user or self.user]
        client = IMAPClient("127.0.0.1", port=self.port, ssl=False, timeout=10)
        client.login(who.name, who.password)
        return client

    def deliver(self, raw: bytes) -> Path:
        """Drop a message into the Maildir's ``new`` as a delivery agent does."""
        name = f"{time.time_ns()}.sq{os.getpid()}.test"
        tmp = self.maildir / "tmp" / name
        tmp.write_bytes(raw)
        os.chown(tmp, self.owner.uid, self.owner.gid)
        final = self.maildir / "new" / name
        tmp.rename(final)
        return final


_DOVECOT_CONF = """\
base_dir = {root}/run
state_dir = {root}/state
instance_name = sq-dovecot-{port}
protocols = imap
listen = 127.0.0.1
ssl = no
disable_plaintext_auth = no
auth_mechanisms = plain login{mechanisms}
default_internal_user = {internal}
default_internal_group = {internal_group}
default_login_user = {login}
first_valid_uid = 1
first_valid_gid = 1
log_path = {root}/dovecot.log
mail_location = maildir:~:LAYOUT=fs
{oauth2}passdb {{
  driver = passwd-file
  args = scheme=PLAIN username_format=%u {root}/passwd
}}
userdb {{
  driver = passwd-file
  args = username_format=%u {root}/passwd
}}
service imap-login {{
  inet_listener imap {{
    address = 127.0.0.1
    port = {port}
  }}
  inet_listener imaps {{
    port = 0
  }}
}}
service anvil {{
  chroot =
}}
service stats {{
  unix_listener stats-reader {{
    mode = 0666
  }}
  unix_listener stats-writer {{
    mode = 0666
  }}
}}
"""


@pytest.fixture
def dovecot(mail_root: Path) -> Iterator[Dovecot]:
    """Dovecot on a free loopback port over a fresh Maildir (see the module docstring)."""
    reason = dovecot_missing()
    if reason:
        _missing(reason)
    with running_dovecot(mail_root) as server:
        yield server


@pytest.fixture
def dovecot_users(mail_root: Path) -> Iterator[Dovecot]:
    """Dovecot as ``dovecot`` serves it, with the users ``ann`` and ``bob`` besides."""
    reason = dovecot_missing()
    if reason:
        _missing(reason)
    with running_dovecot(mail_root, extra_users=("ann", "bob")) as server:
        yield server


def _maildir(path: Path, owner: MailUser) -> Path:
    """An empty Maildir at ``path``, owned by the mail user."""
    for sub in ("cur", "new", "tmp"):
        (path / sub).mkdir(parents=True)
    for made in (path, *(path / sub for sub in ("cur", "new", "tmp"))):
        os.chown(made, owner.uid, owner.gid)
    return path


# No delay after a refused token (the tests refuse some on purpose): no failure delay, and no
# auth penalty (Dovecot's documented switch: the anvil-auth-penalty listener disabled).
_OAUTH2_PASSDB = """\
auth_failure_delay = 0
service anvil {{
  unix_listener anvil-auth-penalty {{
    mode = 0
  }}
}}
passdb {{
  driver = oauth2
  mechanisms = xoauth2
  args = {root}/oauth2.conf.ext
}}
"""


@contextlib.contextmanager
def running_dovecot(
    mail_root: Path, *, extra_users: tuple[str, ...] = (), tokeninfo_url: str | None = None
) -> Iterator[Dovecot]:
    """Dovecot on a free loopback port over a fresh Maildir under ``mail_root`` (a directory
    the unprivileged processes can traverse, as the ``mail_root`` fixture makes), terminated on
    the way out; ``bounces`` owns ``mail_root/Maildir``, each of ``extra_users``
    ``mail_root/Maildir-<user>``, each with a password of its own. Check
    :func:`dovecot_missing` first. With ``tokeninfo_url`` it also takes
    ``AUTHENTICATE XOAUTH2`` (Dovecot's oauth2 passdb), asking that URL, with the token
    appended, whether the token is current and whose (its JSON ``email`` is the user)."""
    owner = _mail_user()
    root = mail_root / "dovecot"
    users = {
        name: MailboxUser(
            name,
            f"{name}-" + os.urandom(6).hex(),
            _maildir(mail_root / ("Maildir" if name == "bounces" else f"Maildir-{name}"), owner),
        )
        for name in ("bounces", *extra_users)
    }
    maildir = users["bounces"].maildir
    root.mkdir()
    root.chmod(0o755)
    port = free_port()
    password = users["bounces"].password
    (root / "passwd").write_text(
        "".join(
            f"{u.name}:{{PLAIN}}{u.password}:{owner.uid}:{owner.gid}::{u.maildir}\n"
            for u in users.values()
        )
    )
    internal_group = grp.getgrgid(pwd.getpwnam(owner.internal_user).pw_gid).gr_name
    if tokeninfo_url is not None:
        (root / "oauth2.conf.ext").write_text(
            f"tokeninfo_url = {tokeninfo_url}\nusername_attribute = email\n"
        )
    conf = root / "dovecot.conf"
    conf.write_text(
        _DOVECOT_CONF.format(
            mechanisms=" xoauth2" if tokeninfo_url else "",
            oauth2=_OAUTH2_PASSDB.format(root=root) if tokeninfo_url else "",
            root=root,
            port=port,
            internal=owner.internal_user,
            internal_group=internal_group,
            login=owner.login_user,
        )
    )
    log = root / "dovecot.log"
    with (root / "stderr.log").open("wb") as stderr:
        process = subprocess.Popen(
            [str(DOVECOT), "-c", str(conf), "-F"], stdout=subprocess.DEVNULL, stderr=stderr
        )
    try:
        _wait_for_port(port, process, log)
        yield Dovecot(port, "bounces", password, maildir, owner, log, users)
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)


@dataclass
class Postfix:
    """A running private Postfix instance (see the module docstring)."""

    port: int
    config_directory: Path
    log: Path

    def queue_is_empty(self) -> bool:
        out = subprocess.run(
            ["/usr/sbin/postqueue", "-c", str(self.config_directory), "-j"],
            capture_output=True,
            check=False,
        )
        return out.returncode == 0 and not out.stdout.strip()

    def submit(self, raw: bytes, *, mail_from: str, to: str) -> None:
        """Mail ``raw`` to ``to`` through this Postfix's smtpd (from loopback: accepted)."""
        with smtplib.SMTP("127.0.0.1", self.port, timeout=10) as smtp:
            smtp.sendmail(mail_from, [to], raw)


def _postconf_default(name: str) -> str:
    out = subprocess.run(
        ["/usr/sbin/postconf", "-d", "-h", name], capture_output=True, text=True, check=True
    )
    return out.stdout.strip()


_POSTFIX_MASTER = """\
127.0.0.1:{port} inet n - n - - smtpd
pickup    unix  n  -  n  60  1  pickup
cleanup   unix  n  -  n  -   0  cleanup
qmgr      unix  n  -  n  300 1  qmgr
rewrite   unix  -  -  n  -   -  trivial-rewrite
bounce    unix  -  -  n  -   0  bounce
defer     unix  -  -  n  -   0  bounce
trace     unix  -  -  n  -   0  bounce
verify    unix  -  -  n  -   1  verify
flush     unix  n  -  n  1000? 0 flush
proxymap  unix  -  -  n  -   -  proxymap
smtp      unix  -  -  n  -   -  smtp
relay     unix  -  -  n  -   -  smtp
showq     unix  n  -  n  -   -  showq
error     unix  -  -  n  -   -  error
retry     unix  -  -  n  -   -  error
discard   unix  -  -  n  -   -  discard
virtual   unix  -  n  n  -   -  virtual
anvil     unix  -  -  n  -   1  anvil
scache    unix  -  -  n  -   1  scache
postlog   unix-dgram n - n - 1  postlogd
"""


@pytest.fixture
def postfix(dovecot: Dovecot, mail_root: Path) -> Iterator[Postfix]:
    """A private Postfix delivering its DSNs into ``dovecot``'s Maildir."""
    with running_postfix(dovecot, mail_root) as server:
        yield server


def _postfix_missing() -> None:
    if not POSTFIX.exists():
        _missing(f"{POSTFIX} not found (Debian: apt-get install postfix)")
    if os.geteuid() != 0:
        _missing("Postfix's master process must be started as root (it drops privileges)")
    try:
        pwd.getpwnam("postfix")
        grp.getgrnam("postdrop")
    except KeyError as exc:
        _missing(f"Postfix needs the postfix user and the postdrop group: {exc}")


@contextlib.contextmanager
def running_postfix(dovecot: Dovecot, mail_root: Path) -> Iterator[Postfix]:
    """A private Postfix (module docstring) delivering mail to the bounce domain into
    ``dovecot``'s ``bounces`` Maildir and mail to ``<user>@inbox.example`` into the Maildir of
    each of ``dovecot``'s other users; skips (fails in CI) when Postfix cannot run."""
    _postfix_missing()
    root = mail_root / "postfix"
    conf, queue, data = root / "conf", root / "queue", root / "data"
    for path in (conf, queue, data):
        path.mkdir(parents=True)
    root.chmod(0o755)
    postfix_user = pwd.getpwnam("postfix")
    os.chown(data, postfix_user.pw_uid, postfix_user.pw_gid)
    port = free_port()
    log = root / "postfix.log"
    owner = dovecot.owner
    (conf / "transport").write_text(
        f"{ERROR_DOMAIN} error:5.1.1 user unknown\n{SINK_DOMAIN} discard:\n"
    )
    (conf / "mailboxes").write_text(
        f"@{BOUNCE_DOMAIN} {dovecot.maildir.name}/\n"
        + "".join(
            f"{user.name}@{INBOX_DOMAIN} {user.maildir.name}/\n"
            for user in dovecot.users.values()
            if user.name != dovecot.user
        )
    )
    (conf / "recipient_access").write_text(f"{REJECT_DOMAIN} 550 5.1.1 user unknown\n")
    main = {
        "compatibility_level": "3.6",
        "config_directory": conf,
        "queue_directory": queue,
        "data_directory": data,
        "daemon_directory": _postconf_default("daemon_directory"),
        "command_directory": _postconf_default("command_directory"),
        "meta_directory": _postconf_default("meta_directory"),
        "shlib_directory": _postconf_default("shlib_directory"),
        "mail_owner": "postfix",
        "setgid_group": "postdrop",
        "myhostname": "mta.sendqueue.test",
        "mydomain": "sendqueue.test",
        "myorigin": "sendqueue.test",
        "mydestination": "",
        "inet_interfaces": "loopback-only",
        "inet_protocols": "ipv4",
        "mynetworks": "127.0.0.0/8",
        "smtpd_relay_restrictions": "permit_mynetworks, reject",
        "smtpd_recipient_restrictions": (
            f"check_recipient_access texthash:{conf / 'recipient_access'}, "
            "permit_mynetworks, reject"
        ),
        "smtpd_reject_unlisted_recipient": "no",
        "transport_maps": f"texthash:{conf / 'transport'}",
        "virtual_mailbox_domains": f"{BOUNCE_DOMAIN}, {INBOX_DOMAIN}",
        # every address of the bounce domain goes to the one Maildir, each user of the inbox
        # domain to its own (relative to the base)
        "virtual_mailbox_base": dovecot.maildir.parent,
        "virtual_mailbox_maps": f"texthash:{conf / 'mailboxes'}",
        "virtual_uid_maps": f"static:{owner.uid}",
        "virtual_gid_maps": f"static:{owner.gid}",
        "virtual_minimum_uid": "1",
        "maillog_file": log,
        "maillog_file_prefixes": str(mail_root),
        "alias_maps": "",
        "alias_database": "",
        "local_recipient_maps": "",
        "biff": "no",
        "smtputf8_enable": "no",
        "delay_warning_time": "0",
    }
    (conf / "main.cf").write_text("".join(f"{key} = {value}\n" for key, value in main.items()))
    (conf / "master.cf").write_text(_POSTFIX_MASTER.format(port=port))
    started = subprocess.run(
        [str(POSTFIX), "-c", str(conf), "start"], capture_output=True, text=True, check=False
    )
    try:
        if started.returncode != 0:
            text = log.read_text(errors="replace") if log.exists() else started.stderr
            raise RuntimeError(f"postfix -c {conf} start failed:\n{text[-3000:]}")
        _wait_for_port(port, None, log)
        yield Postfix(port, conf, log)
    finally:
        subprocess.run([str(POSTFIX), "-c", str(conf), "stop"], capture_output=True, check=False)
