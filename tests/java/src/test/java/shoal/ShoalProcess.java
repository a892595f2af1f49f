package shoal;

import java.net.ServerSocket;
import java.net.Socket;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.List;
import java.util.concurrent.TimeUnit;
import java.util.stream.Stream;

/**
 * One `shoal server` process on 127.0.0.1 and a free port, for a test class. Its data and
 * log live in a temporary directory of its own, removed when it is closed.
 */
final class ShoalProcess implements AutoCloseable {
  final Process process;
  final int port;
  private final Path directory;

  private ShoalProcess(Process process, int port, Path directory) {
    this.process = process;
    this.port = port;
    this.directory = directory;
  }

  /** Starts the binary named by the `shoal.bin` property and waits until it listens. */
  static ShoalProcess start(String... extraArgs) throws Exception {
    String binary = System.getProperty("shoal.bin");
    int port;
    try (ServerSocket probe = new ServerSocket(0)) {
      port = probe.getLocalPort();
    }
    Path directory = Files.createTempDirectory("shoal-java");
    Path log = directory.resolve("shoal.log");
    List<String> command = new ArrayList<>(List.of(binary, "server",
        "--data-dir", directory.resolve("data").toString(),
        "--listen-address", "127.0.0.1", "--cql-port", Integer.toString(port)));
    command.addAll(List.of(extraArgs));
    Process process = new ProcessBuilder(command)
        .redirectErrorStream(true)
        .redirectOutput(log.toFile())
        .start();
    ShoalProcess shoal = new ShoalProcess(process, port, directory);
    long deadline = System.currentTimeMillis() + 30_000;
    while (true) {
      try (Socket socket = new Socket("127.0.0.1", port)) {
        return shoal;
      } catch (Exception notYet) {
        if (System.currentTimeMillis() > deadline || !process.isAlive()) {
          String output = Files.readString(log);
          shoal.close();
          throw new IllegalStateException("shoal did not start; its output:\n" + output);
        }
        Thread.sleep(50);
      }
    }
  }

  /** Stops the node and removes its directory. */
  @Override
  public void close() throws Exception {
    process.destroy();
    if (!process.waitFor(30, TimeUnit.SECONDS)) {
      process.destroyForcibly();
      process.waitFor(30, TimeUnit.SECONDS);
    }
    deleteTree(directory);
  }

  /** Removes `root` and everything under it, if it exists. */
  static void deleteTree(Path root) throws Exception {
    if (!Files.exists(root)) {
      return;
    }
    try (Stream<Path> paths = Files.walk(root)) {
      for (Path path : paths.sorted(Comparator.reverseOrder()).toList()) {
        Files.delete(path);
      }
    }
  }
}
