package retrysim.harness;

import java.io.IOException;
import java.util.Arrays;

/**
 * A child JVM of the harness: runs the main of the class named by the first argument with the
 * rest, and exits when the harness is gone (its stdin, a pipe from the harness, closes), even
 * if the harness was killed before it could stop it.
 */
public final class Child {
  private Child() {}

  public static void main(String[] args) throws Exception {
    Thread watch = new Thread(() -> {
      try {
        while (System.in.read() >= 0) {
          // the harness writes nothing
        }
      } catch (IOException closed) {
        // gone as well
      }
      System.exit(1);
    }, "retrysim-harness-watch");
    watch.setDaemon(true);
    watch.start();
    Class.forName(args[0]).getMethod("main", String[].class)
        .invoke(null, (Object) Arrays.copyOfRange(args, 1, args.length));
  }
}
