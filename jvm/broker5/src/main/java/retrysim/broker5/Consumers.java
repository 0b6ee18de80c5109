package retrysim.broker5;

import java.lang.reflect.Field;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.function.BooleanSupplier;
import java.util.function.Function;
import org.apache.rocketmq.client.apis.ClientConfiguration;
import org.apache.rocketmq.client.apis.ClientServiceProvider;
import org.apache.rocketmq.client.apis.consumer.ConsumeResult;
import org.apache.rocketmq.client.apis.consumer.FilterExpression;
import org.apache.rocketmq.client.apis.consumer.PushConsumer;
import org.apache.rocketmq.client.apis.consumer.SimpleConsumer;
import org.apache.rocketmq.client.apis.message.MessageView;
import org.apache.rocketmq.client.java.message.MessageViewImpl;

/**
 * The group's consumers, on the official gRPC client, in the client's own class loader (see
 * Harness.startConsumers): only JDK types cross to the harness. Ready ({@link #getAsBoolean})
 * once a push consumer holds its assignments (one per broker, or each queue of a FIFO group) and
 * every simple consumer thread has asked for messages once.
 */
public final class Consumers implements BooleanSupplier, AutoCloseable {
  private final Map<String, String> settings;
  private final Function<String[], String> listener;
  private final List<AutoCloseable> clients = new ArrayList<>();
  private final List<Thread> threads = new ArrayList<>();
  private final AtomicInteger receiving = new AtomicInteger();
  private final AtomicInteger inFlight = new AtomicInteger();
  private volatile boolean stopped;

  public Consumers(Map<String, String> settings, Function<String[], String> listener)
      throws Exception {
    this.settings = settings;
    this.listener = listener;
    ClientServiceProvider provider = ClientServiceProvider.loadService();
    ClientConfiguration configuration = ClientConfiguration.newBuilder()
        .setEndpoints(settings.get("endpoint")).enableSsl(false).build();
    Map<String, FilterExpression> subscription =
        Map.of(settings.get("topic"), FilterExpression.SUB_ALL);
    int instances = integer("instances");
    int threadCount = integer("threads");
    for (int i = 0; i < instances; i++) {
      String instance = String.valueOf(i);
      if (settings.get("consumer").equals("simple")) {
        SimpleConsumer consumer = provider.newSimpleConsumerBuilder()
            .setClientConfiguration(configuration)
            .setConsumerGroup(settings.get("group"))
            .setSubscriptionExpressions(subscription)
            .setAwaitDuration(Duration.ofSeconds(5))
            .build();
        clients.add(consumer);
        for (int t = 0; t < threadCount; t++) {
          Thread thread = new Thread(() -> receive(consumer, instance), "simple-" + i + "-" + t);
          threads.add(thread);
          thread.start();
        }
      } else {
        clients.add(provider.newPushConsumerBuilder()
            .setClientConfiguration(configuration)
            .setConsumerGroup(settings.get("group"))
            .setSubscriptionExpressions(subscription)
            .setConsumptionThreadCount(threadCount)
            .setMaxCacheMessageCount(integer("max_cache_message_count"))
            .setMessageListener(view -> consume(view, instance))
            .build());
      }
    }
  }

  private int integer(String key) {
    return Integer.parseInt(settings.get(key));
  }

  private String deliver(MessageView view, String instance) {
    inFlight.incrementAndGet();
    try {
      MessageViewImpl impl = (MessageViewImpl) view;
      return listener.apply(new String[] {String.join(" ", view.getKeys()),
          String.valueOf(view.getDeliveryAttempt()), impl.getReceiptHandle(), instance});
    } finally {
      inFlight.decrementAndGet();
    }
  }

  private ConsumeResult consume(MessageView view, String instance) {
    switch (deliver(view, instance)) {
      case "CONSUME_SUCCESS":
        return ConsumeResult.SUCCESS;
      case "EXCEPTION":
        throw new IllegalStateException("the scenario's listener throws");
      case "NULL_RETURN":
        return null;
      default:
        return ConsumeResult.FAILURE;
    }
  }

  /** One simple consumer thread: a message at a time; ack on success, else let it reappear. */
  private void receive(SimpleConsumer consumer, String instance) {
    Duration invisible = Duration.ofMillis(Long.parseLong(settings.get("invisible_duration_ms")));
    boolean first = true;
    while (!stopped) {
      try {
        if (first) {
          receiving.incrementAndGet();
          first = false;
        }
        for (MessageView view : consumer.receive(1, invisible)) {
          if (deliver(view, instance).equals("CONSUME_SUCCESS")) {
            consumer.ack(view);
          }
        }
      } catch (Exception e) {
        if (!stopped) {
          System.err.println("retrysim broker5: simple consumer " + instance + ": " + e);
          try {
            Thread.sleep(200);
          } catch (InterruptedException interrupted) {
            return;
          }
        }
      }
    }
  }

  @Override
  public boolean getAsBoolean() {
    if (!threads.isEmpty()) {
      return receiving.get() == threads.size();
    }
    int expected = settings.get("consumer").equals("push_fifo") ? integer("queues") : 1;
    try {
      for (AutoCloseable client : clients) {
        Field table = client.getClass().getDeclaredField("processQueueTable");
        table.setAccessible(true);
        if (((Map<?, ?>) table.get(client)).size() < expected) {
          return false;
        }
      }
      return true;
    } catch (ReflectiveOperationException e) {
      throw new IllegalStateException("the push consumer's assignments: " + e, e);
    }
  }

  /**
   * At the horizon: no more receives (the push consumers' own close, which also waits for their
   * long polls in flight, up to 20 s, goes on in the background: the JVM exits next); the
   * listeners still running finish, within await_ms; then 1 s for their acks and nacks to land
   * (as the push consumer's close allows).
   */
  @Override
  public void close() throws Exception {
    stopped = true;
    long deadline = System.currentTimeMillis() + Long.parseLong(settings.get("await_ms"));
    if (threads.isEmpty()) {
      for (AutoCloseable client : clients) {
        new Thread(() -> {
          try {
            client.close();
          } catch (Exception ignored) {
            // the JVM exits next
          }
        }, "close-" + client).start();
      }
    }
    for (Thread thread : threads) {
      thread.join(Math.max(1, deadline - System.currentTimeMillis()));
    }
    while (inFlight.get() > 0 && System.currentTimeMillis() < deadline) {
      Thread.sleep(10);
    }
    Thread.sleep(1_000);
  }
}
