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
 * here as the client hands the message over. With outages, each row has one more pair,
 * {@code outcome,processing_ms}, for a delivery that starts inside each of the windows the
 * outages property names ({@code start_ms-end_ms,...}, ms from t0, end excluded, in the
 * rows' order): the listener takes the pair of the window its delivery starts in.
 */
public final class Listener {
  /** One delivery: its number, what the listener returns and when it started (ms from t0). */
  public record Delivery(int number, String outcome, long startMs) {}

  private final Map<String, String[]> drawn = new HashMap<>();
  private final Map<Long, AtomicInteger> seen = new ConcurrentHashMap<>();
  private final long[][] windows; // [start, end) ms from t0

  /** The outcomes file and the outages' windows ("" or null: none). */
  public Listener(Path outcomes, String outages) throws IOException {
    for (String line : Files.readAllLines(outcomes)) {
      String[] cells = line.split(",");
      drawn.put(cells[0] + "/" + cells[1], cells);
    }
    String[] named = outages == null || outages.isBlank() ? new String[0] : outages.split(",");
    windows = new long[named.length][];
    for (int i = 0; i < named.length; i++) {
      String[] edges = named[i].trim().split("-");
      windows[i] = new long[] {Long.parseLong(edges[0]), Long.parseLong(edges[1])};
    }
  }

  /** The cell of the outcome drawn for a delivery starting at {@code startMs}. */
  private int column(long startMs) {
    for (int i = 0; i < windows.length; i++) {
      if (windows[i][0] <= startMs && startMs < windows[i][1]) {
        return 4 + 2 * i;
      }
    }
    return 2;
  }

  /**
   * The next delivery of {@code msgId}, back after its processing time. A delivery the file
   * does not hold (beyond the last retrysim allows) succeeds at once.
   */
  public Delivery deliver(long msgId, long t0) {
    int number = seen.computeIfAbsent(msgId, id -> new AtomicInteger()).incrementAndGet();
    String[] outcome = drawn.get(msgId + "/" + number);
    long start = System.currentTimeMillis() - t0;
    int cell = column(start);
    sleep(outcome == null ? 0 : Long.parseLong(outcome[cell + 1]));
    return new Delivery(number, outcome == null ? "CONSUME_SUCCESS" : outcome[cell], start);
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
