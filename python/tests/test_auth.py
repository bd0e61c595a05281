"""The cluster secret from Python: a client holding it uses a pool that requires it, one
without it is refused, and a client holding it refuses a pool that does not hold one."""

import os
import tempfile
import unittest

from harness import LivePool
from rbgctl.client import Client
from rbgctl.config import ClientConfig
from rbgctl.errors import ConfigError, RbgctlError

SECRET = b"a-secret-of-this-python-test-0123456789\n"


def token_file(text: bytes) -> str:
    fd, path = tempfile.mkstemp(prefix="rbgctl-pytest-token-")
    with os.fdopen(fd, "wb") as f:
        f.write(text)
    return path


class Auth(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.token = token_file(SECRET)
        cls.pool = LivePool(stores=1, segment="64MiB", auth_token_file=cls.token)

    @classmethod
    def tearDownClass(cls):
        cls.pool.close()
        os.unlink(cls.token)

    def test_a_client_holding_the_secret_puts_and_gets(self):
        cfg = ClientConfig(master=self.pool.master, auth_token_file=self.token, same_host_shm=False)
        with Client(cfg) as c:
            c.put("py-auth", b"x" * 100_000)
            self.assertEqual(bytes(c.get("py-auth")), b"x" * 100_000)

    def test_the_secret_comes_from_the_environment_or_a_mapping(self):
        cfg = ClientConfig.from_env({"RBGCTL_MASTER": self.pool.master, "RBGCTL_AUTH_TOKEN_FILE": self.token})
        self.assertEqual(cfg.auth_token_file, self.token)
        cfg = ClientConfig.from_mapping({"master": self.pool.master, "auth_token_file": self.token}, env={})
        with Client(cfg) as c:
            self.assertTrue(c.segments())

    def test_a_client_without_the_secret_is_refused(self):
        with self.assertRaises(RbgctlError) as e:
            with Client(ClientConfig(master=self.pool.master)) as c:
                c.segments()
        self.assertIn("UNAUTHENTICATED", str(e.exception))

    def test_another_secret_is_refused_and_a_short_one_is_a_clear_error(self):
        other = token_file(b"another-secret-not-this-clusters")
        try:
            with self.assertRaises(RbgctlError) as e:
                with Client(ClientConfig(master=self.pool.master, auth_token_file=other)) as c:
                    c.segments()
            self.assertIn("did not prove", str(e.exception))
        finally:
            os.unlink(other)
        short = token_file(b"short\n")
        try:
            with self.assertRaises(ConfigError) as e:
                ClientConfig(master=self.pool.master, auth_token_file=short).auth_secret()
            self.assertIn("at least 16", str(e.exception))
        finally:
            os.unlink(short)


class NoSecretHere(unittest.TestCase):
    def test_a_client_holding_the_secret_refuses_a_pool_without_one(self):
        token = token_file(SECRET)
        try:
            with LivePool(stores=1, segment="64MiB") as pool:
                with self.assertRaises(RbgctlError) as e:
                    with Client(ClientConfig(master=pool.master, auth_token_file=token)) as c:
                        c.segments()
                self.assertIn("holds no cluster secret", str(e.exception))
        finally:
            os.unlink(token)


if __name__ == "__main__":
    unittest.main()
