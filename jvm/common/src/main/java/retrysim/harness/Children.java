package retrysim.harness;

import java.io.IOException;
import java.lang.management.ManagementFactory;
import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.net.ServerSocket;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.List;
import java.util.concurrent.TimeUnit;

/**
 * The harness's child JVMs (namesrv, broker or proxy) and the folder they share, their
 * ROCKETMQ_HOME and user home with the store under it. Each child is this java, class path and
 * module flags with a small heap and the serial GC, so that the broker's GC and threads do not
 * share a JVM with the consumers whose timings are measured. However the harness ends (a
 * failure, or a SIGTERM through the shutdown hook), {@link #close} stops them, the last started
 * first, and deletes the folder; a child whose harness was killed outright exits by itself
 * ({@link Child}).
 */
public final class Children implements AutoCloseable {
  private static final long START_MS = 30_000; // how long a child may take to come up
  private static final long STOP_MS = 5_000; // how long a child may take to stop when asked

  private final String harness;
  private final Path home;
  private final Path logs;
  private final List<Process> started = new ArrayList<>(); // guarded by itself
  private boolean stopping; // guarded by started

  /** A new folder for the children of {@code harness}, their logs going to {@code logs}. */
  public Children(String harness, Path logs) throws IOException {
    this.harness = harness;
    this.logs = logs;
    this.home = Files.createTempDirectory("retrysim-" + harness + "-");
    Runtime.getRuntime().addShutdownHook(new Thread(this::close, "retrysim-stop"));
  }

  /** The children's ROCKETMQ_HOME and user home. */
  public Path home() {
    return home;
  }

  /** A file of the children's folder with these lines. */
  public Path write(String name, String... lines) throws IOException {
    return Files.write(home.resolve(name), List.of(lines));
  }

  /**
   * Starts a child running {@code main} with {@code args}, its output in {@code <name>.log};
   * back once that says {@code up}. A child that exits first, or is not up within 30 s, is an
   * IllegalStateException naming it, with the first exception its log shows.
   */
  public void start(String name, String heap, String up, String main, String... args)
      throws IOException, InterruptedException {
    List<String> command = new ArrayList<>(List.of(
        ProcessHandle.current().info().command().orElseThrow(), "-Xmx" + heap,
        "-XX:+UseSerialGC", "-Duser.home=" + home));
    for (String flag : ManagementFactory.getRuntimeMXBean().getInputArguments()) {
      if (flag.startsWith("--add-opens") || flag.startsWith("--add-exports")) {
        command.add(flag); // what the store reaches into on Java 17, as in this JVM
      }
    }
    command.addAll(List.of("-cp", System.getProperty("java.class.path"),
        Child.class.getName(), main));
    command.addAll(List.of(args));
    Path log = logs.resolve(name + ".log");
    ProcessBuilder builder = new ProcessBuilder(command).redirectErrorStream(true)
        .redirectOutput(log.toFile());
    builder.environment().put("ROCKETMQ_HOME", home.toString());
    Process child;
    synchronized (started) {
      if (stopping) {
        throw new IllegalStateException("stopped");
      }
      child = builder.start();
      started.add(child);
    }
    long deadline = System.currentTimeMillis() + START_MS;
    while (!Files.readString(log).contains(up)) {
      if (!child.isAlive() || System.currentTimeMillis() > deadline) {
        // the official mains print their exception's stack trace: its first line says why
        String why = Files.readAllLines(log).stream()
            .filter(line -> line.matches("^[\\w.$]+(Exception|Error)(: .*)?$"))
            .findFirst().map(line -> " (" + line + ")")
            .orElse(child.isAlive() ? " in " + START_MS / 1000 + " s" : "");
        throw new IllegalStateException(
            "the " + name + " did not start" + why + "; see " + log);
      }
      Thread.sleep(50);
    }
  }

  /** Every child asked to stop, the last started first, then killed; their folder deleted. */
  @Override
  public void close() {
    List<Process> running;
    synchronized (started) {
      if (stopping) {
        return;
      }
      stopping = true;
      running = new ArrayList<>(started);
    }
    try {
      for (int i = running.size() - 1; i >= 0; i--) {
        Process child = running.get(i);
        child.destroy();
        if (!child.waitFor(STOP_MS, TimeUnit.MILLISECONDS)) {
          child.destroyForcibly().waitFor(STOP_MS, TimeUnit.MILLISECONDS);
        }
      }
      try (var paths = Files.walk(home)) {
        for (Path path : paths.sorted(Comparator.reverseOrder()).toList()) {
          Files.deleteIfExists(path);
        }
      }
    } catch (IOException | InterruptedException e) {
      System.err.println(harness + ": stopping the children: " + e);
    }
  }

  /** A free port on loopback. */
  public static int freePort() throws IOException {
    try (ServerSocket socket = new ServerSocket(0, 50, InetAddress.getLoopbackAddress())) {
      return socket.getLocalPort();
    }
  }

  /**
   * A free port p for a broker with p - 2 (its fast, VIP, server) and p + 1 (4.9.7's HA port,
   * which it takes from p whatever its config says) free too.
   */
  public static int freeBrokerPort() throws IOException {
    for (int tries = 0; ; tries++) {
      int port = freePort();
      if (port > 1026 && port < 65535 && free(port - 2) && free(port + 1)) {
        return port;
      }
      if (tries == 20) {
        throw new IOException("no free broker port with its neighbours on loopback");
      }
    }
  }

  private static boolean free(int port) {
    try (ServerSocket socket = new ServerSocket()) {
      socket.bind(new InetSocketAddress(InetAddress.getLoopbackAddress(), port));
      return true;
    } catch (IOException taken) {
      return false;
    }
  }
}
