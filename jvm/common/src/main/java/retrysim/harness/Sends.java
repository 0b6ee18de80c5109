package retrysim.harness;

import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicReference;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.client.producer.SendCallback;
import org.apache.rocketmq.client.producer.SendResult;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageQueue;

/**
 * The producer's asynchronous sends, each its callback: a message leaves at its born time
 * without waiting for the previous one's answer (a synchronous send, a round trip each, fell
 * 0.5 s behind 2,000 messages a second on two cores), and the run fails if one of them did.
 * Both majors' clients have these classes, and each harness compiles this against its own.
 */
public final class Sends implements SendCallback {
  private final AtomicInteger out = new AtomicInteger();
  private final AtomicReference<Throwable> failed = new AtomicReference<>();

  /**
   * {@code message} to {@code queue}: asynchronously, or synchronously when {@code ordered}, as
   * ordered messages are sent, since two sends in flight may be stored in either order.
   */
  public void send(DefaultMQProducer producer, Message message, MessageQueue queue,
      boolean ordered) throws Exception {
    if (ordered) {
      producer.send(message, queue);
      return;
    }
    out.incrementAndGet();
    producer.send(message, queue, this);
  }

  @Override
  public void onSuccess(SendResult result) {
    out.decrementAndGet();
  }

  @Override
  public void onException(Throwable error) {
    failed.compareAndSet(null, error);
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
