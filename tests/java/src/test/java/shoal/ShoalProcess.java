package shoal;

import java.net.ServerSocket;
import java.net.Socket;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.TimeUnit;

/** One `shoal server` process on 127.0.0.1 and a free port, for a test class. */
final class ShoalProcess implements AutoCloseable {
  final Process process;
  final int port;

  private ShoalProcess(Process process, int port) {
    this.process = process;
    this.port = port;
  }

  /** Starts the binary named by the `shoal.bin` property and waits until it listens. */
  static ShoalProcess start(String... extraArgs) throws Exception {
    String binary = System.getProperty("shoal.bin");
    int port;
    try (ServerSocket probe = new ServerSocket(0)) {
      port = probe.getLocalPort();
    }
    Path data = Files.createTempDirectory("shoal-java");
    List<String> command = new ArrayList<>(List.of(binary, "server", "--data-dir", data.toString(),
        "--listen-address", "127.0.0.1", "--cql-port", Integer.toString(port)));
    command.addAll(List.of(extraArgs));
    Process process = new ProcessBuilder(command)
        .redirectErrorStream(true)
        .redirectOutput(data.resolveSibling(data.getFileName() + ".log").toFile())
        .start();
    ShoalProcess shoal = new ShoalProcess(process, port);
    long deadline = System.currentTimeMillis() + 30_000;
    while (true) {
      try (Socket socket = new Socket("127.0.0.1", port)) {
        return shoal;
      } catch (Exception notYet) {
        if (System.currentTimeMillis() > deadline || !process.isAlive()) {
          shoal.close();
          throw new IllegalStateException("shoal did not start");
        }
        Thread.sleep(50);
      }
    }
  }

  @Override
  public void close() throws Exception {
    process.destroy();
    if (!process.waitFor(30, TimeUnit.SECONDS)) {
      process.destroyForcibly();
    }
  }
}
