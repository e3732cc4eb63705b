"""`gemma4 serve` as a child process for the server tests: started on a free
loopback port (--port 0; the port is read from the first line it prints),
its stderr kept in a log file, stopped with a signal and waited for.

The tests keep their own checks on what stop() returns (the exit status,
the log's sanitizer reports).
"""
import re
import signal
import subprocess

# what a sanitizer or a crash writes to stderr
SANITIZER_REPORTS = ("AddressSanitizer", "LeakSanitizer", "runtime error:")
CRASH_REPORTS = SANITIZER_REPORTS + ("Segmentation", "Aborted")


class ServeProcess:
    def __init__(self, binary, model, args, log_path):
        """Starts `binary serve -m model --port 0 *args`; RuntimeError with
        the log's end when it exits before printing its address."""
        self.log = open(log_path, "w+")
        cmd = [binary, "serve", "-m", model, "--port", "0", *args]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self.log, text=True)
        line = self.proc.stdout.readline()
        m = re.search(r"http://[^:]+:(\d+)", line)
        if not m:
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.log.seek(0)
            text = self.log.read()
            self.log.close()
            raise RuntimeError("server did not start: %r %s" % (line, text[-2000:]))
        self.port = int(m.group(1))
        self.url = "http://127.0.0.1:%d" % self.port

    def stop(self, sig=signal.SIGTERM, timeout=60):
        """Sends sig (if it still runs) and waits up to timeout seconds, then
        kills it. Returns (exit status, the log's text, whether it had to be
        killed)."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        killed = False
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait()
            killed = True
        self.log.seek(0)
        text = self.log.read()
        self.log.close()
        return rc, text, killed
