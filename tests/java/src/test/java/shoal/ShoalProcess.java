package shoal;

import java.io.IOException;
import java.net.InetSocketAddress;
import java.net.ServerSocket;
import java.net.Socket;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.Iterator;
import java.util.List;
import java.util.Random;
import java.util.concurrent.TimeUnit;
import java.util.stream.IntStream;
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
    int port = freePort();
    int internodePort = freePort();
    Path directory = Files.createTempDirectory("shoal-java");
    Path log = directory.resolve("shoal.log");
    List<String> command = new ArrayList<>(List.of(binary, "server",
        "--data-dir", directory.resolve("data").toString(),
        "--listen-address", "127.0.0.1", "--cql-port", Integer.toString(port),
        "--internode-port", Integer.toString(internodePort)));
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

  /** Ports not handed out yet in this run, from 10000 up to the ephemeral range. */
  private static final Iterator<Integer> CANDIDATES = portCandidates();

  /**
   * A port free on 127.0.0.1 right now, never handed out before in this run. It comes from
   * below the kernel's ephemeral range: a port from that range, found free a moment ago, can
   * be taken by any outgoing connection before the node binds it, and the node then fails to
   * start with "Address already in use". Below the range, only a process that asks for that
   * very port takes it.
   */
  static synchronized int freePort() throws Exception {
    while (CANDIDATES.hasNext()) {
      int port = CANDIDATES.next();
      try (ServerSocket probe = new ServerSocket()) {
        probe.setReuseAddress(true);
        probe.bind(new InetSocketAddress("127.0.0.1", port));
        return port;
      } catch (IOException taken) {
        // Someone else's; try the next one.
      }
    }
    throw new IllegalStateException("no port free below the ephemeral range");
  }

  private static Iterator<Integer> portCandidates() {
    int ceiling = 32768;
    try {
      // readAllLines, not readString: a /proc file reports a size of 0, and readString
      // then reads only its first bytes.
      String range = Files.readAllLines(Path.of("/proc/sys/net/ipv4/ip_local_port_range")).get(0);
      ceiling = Integer.parseInt(range.trim().split("\\s+")[0]);
    } catch (Exception unknown) {
      // Not Linux, or unreadable: the usual start of the range.
    }
    int floor = 10_000;
    int span = Math.max(ceiling - floor, 1);
    int start = new Random().nextInt(span);
    return IntStream.range(0, span)
        .map(step -> floor + (start + step) % span)
        .iterator();
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
