package retrysim.harness;

import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicReference;

/**
 * The producer's asynchronous sends: each message leaves at its born time without waiting for
 * the previous one's answer (a synchronous send, a round trip each, fell 0.5 s behind 2,000
 * messages a second on two cores), and the run fails if one of them did.
 */
public final class Sends {
  private final AtomicInteger out = new AtomicInteger();
  private final AtomicReference<Throwable> failed = new AtomicReference<>();

  /** One more send on its way. */
  public void sending() {
    out.incrementAndGet();
  }

  /** A send answered: {@code error} is null when the broker stored it. */
  public void answered(Throwable error) {
    if (error != null) {
      failed.compareAndSet(null, error);
    }
    out.decrementAndGet();
  }

  /** Every send answered, and stored: else an IllegalStateException saying which failed. */
  public void check() {
    Throwable error = failed.get();
    if (error != null) {
      throw new IllegalStateException("a message was not sent: " + error);
    }
    if (out.get() > 0) {
      throw new IllegalStateException(out.get() + " messages unanswered at the horizon");
    }
  }
}
