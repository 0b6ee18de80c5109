package retrysim.harness;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.HashMap;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicInteger;

/**
 * The scenario's listener as retrysim drew it, so that the broker and retrysim see the same
 * one: each delivery's outcome and processing time by message and delivery number (the
 * outcomes file, {@code msg_id,delivery,outcome,processing_ms}), the delivery numbers counted
 * here as the client hands the message over.
 */
public final class Listener {
  /** One delivery: its number, what the listener returns and when it started (ms from t0). */
  public record Delivery(int number, String outcome, long startMs) {}

  private final Map<String, String[]> drawn = new HashMap<>();
  private final Map<Long, AtomicInteger> seen = new ConcurrentHashMap<>();

  public Listener(Path outcomes) throws IOException {
    for (String line : Files.readAllLines(outcomes)) {
      String[] cells = line.split(",");
      drawn.put(cells[0] + "/" + cells[1], cells);
    }
  }

  /**
   * The next delivery of {@code msgId}, back after its processing time. A delivery the file
   * does not hold (beyond the last retrysim allows) succeeds at once.
   */
  public Delivery deliver(long msgId, long t0) {
    int number = seen.computeIfAbsent(msgId, id -> new AtomicInteger()).incrementAndGet();
    String[] outcome = drawn.get(msgId + "/" + number);
    long start = System.currentTimeMillis() - t0;
    sleep(outcome == null ? 0 : Long.parseLong(outcome[3]));
    return new Delivery(number, outcome == null ? "CONSUME_SUCCESS" : outcome[2], start);
  }

  /** Sleeps {@code ms} if positive; an interrupt is kept for the caller to see. */
  public static void sleep(long ms) {
    if (ms <= 0) {
      return;
    }
    try {
      Thread.sleep(ms);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
    }
  }
}
