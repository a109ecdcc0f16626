"""The four binaries the image ships print one version and one commit with --version: the
project's version (CMakeLists.txt) and the commit of the tree they were built from."""
import os
import re
import subprocess
import unittest

BUILD = os.environ.get("SOCKMESH_BUILD_DIR", "build")
SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
BINARIES = {
    "sockmesh-proxy": "userspace/sockmesh-proxy",
    "sockmesh-loader": "loader/sockmesh-loader",
    "sockmesh-cni": "cni/sockmesh-cni",
    "sockmesh-install-cni": "cni/sockmesh-install-cni",
}


class VersionTest(unittest.TestCase):
    def test_same_version_and_commit(self):
        with open(os.path.join(SOURCE, "CMakeLists.txt")) as f:
            project = re.search(r"project\(sockmesh VERSION ([0-9.]+)", f.read()).group(1)
        seen = {}
        for name, rel in BINARIES.items():
            out = subprocess.run([os.path.join(BUILD, rel), "--version"], capture_output=True,
                                 text=True, timeout=10, env={})
            self.assertEqual(out.returncode, 0, f"{name}: {out.stderr}")
            m = re.fullmatch(rf"{name} (\S+) \(commit (\S+)\)\n", out.stdout)
            self.assertIsNotNone(m, f"{name} printed {out.stdout!r}")
            seen[name] = (m.group(1), m.group(2))
        self.assertEqual(len(set(seen.values())), 1, seen)
        version, commit = next(iter(seen.values()))
        self.assertEqual(version, project)
        # The commit is the tree's at build time: HEAD after a fresh build (as in CI), an
        # ancestor of HEAD when commits were made since the last build.
        built = commit.removesuffix("-dirty")
        if subprocess.run(["git", "-C", SOURCE, "rev-parse", "HEAD"],
                          capture_output=True).returncode == 0:
            self.assertRegex(built, r"^[0-9a-f]{12}$", commit)
            r = subprocess.run(["git", "-C", SOURCE, "merge-base", "--is-ancestor", built, "HEAD"])
            self.assertEqual(r.returncode, 0, f"{commit} is not HEAD nor one of its ancestors")


if __name__ == "__main__":
    unittest.main(verbosity=2)
